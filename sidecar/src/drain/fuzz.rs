//! Property: every drain config the loader accepts runs a whole drain
//! (`Serving -> Draining -> Closing -> Drained`) without a panic, and every
//! one past a bound is refused naming its key. Timers at the bound (1h)
//! cost nothing: tokio's clock is paused and jumps to the next timer.
//!
//! `make test-unit` runs 64 cases; `KUBEGRACE_FUZZ_CASES` sets the count,
//! and `make fuzz` runs it long.

use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::{Drain, ExitTrigger, Phase};
use crate::config::bounds::MAX_DRAIN_TIMER;
use crate::config::{Config, DrainConfig, HumanDuration};

fn config() -> ProptestConfig {
    crate::testing::fuzz_config(64)
}

/// A drain timer: zero, short, anywhere up to the bound, at it, just past
/// it, or absurd (up to `Duration::MAX`, what a typo like
/// `5124095576030431h` parses to and more).
fn timer() -> impl Strategy<Value = HumanDuration> {
    let bound = u64::try_from(MAX_DRAIN_TIMER.as_nanos()).unwrap_or(u64::MAX);
    prop_oneof![
        Just(Duration::ZERO),
        (0u64..5_000).prop_map(Duration::from_millis),
        (0..=bound).prop_map(Duration::from_nanos),
        Just(MAX_DRAIN_TIMER),
        (1u64..1_000).prop_map(|n| MAX_DRAIN_TIMER + Duration::from_nanos(n)),
        (bound..=u64::MAX).prop_map(Duration::from_secs),
        Just(Duration::MAX),
    ]
    .prop_map(HumanDuration)
}

fn drain_config() -> impl Strategy<Value = DrainConfig> {
    (timer(), timer(), timer(), timer(), timer(), timer()).prop_map(
        |(min_delay, quiet, max_delay, timeout, window, wait)| DrainConfig {
            min_delay,
            quiet,
            max_delay,
            timeout,
            websocket_close_window: window,
            websocket_close_wait: wait,
            ..DrainConfig::default()
        },
    )
}

/// What the loader must say, worked out independently of it.
fn expected_refusal(d: &DrainConfig) -> Option<&'static str> {
    if d.min_delay > d.max_delay {
        return Some("drain.minDelay");
    }
    if d.timeout.get().is_zero() {
        return Some("drain.timeout");
    }
    [
        ("drain.minDelay", d.min_delay),
        ("drain.quiet", d.quiet),
        ("drain.maxDelay", d.max_delay),
        ("drain.timeout", d.timeout),
        ("drain.websocketCloseWindow", d.websocket_close_window),
        ("drain.websocketCloseWait", d.websocket_close_wait),
    ]
    .into_iter()
    .find(|(_, v)| v.get() > MAX_DRAIN_TIMER)
    .map(|(key, _)| key)
}

/// A runtime on a paused clock: the drain's timers pass at once.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}

/// One whole drain on a paused clock; `stuck` holds a connection open
/// through `Closing` so the force-close at `timeout` runs too.
fn full_drain(timers: DrainConfig, stuck: bool, new_conns: u8) {
    paused_runtime().block_on(async move {
        let drain = Drain::new(timers);
        let held = stuck.then(|| drain.connection());
        let mut driver = tokio::spawn(drain.clone().run());
        let mut rx = drain.subscribe();
        let t0 = Instant::now();
        assert_eq!(drain.trigger_exit("fuzz"), ExitTrigger::Started);
        assert_eq!(drain.phase(), Phase::Draining);
        // Routers still sending: new connections restart the quiet clock.
        for _ in 0..new_conns {
            drop(drain.connection());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        rx.wait_for(|s| s.phase >= Phase::Closing)
            .await
            .expect("drain alive");
        if let Some(mut conn) = held {
            rx.wait_for(|s| s.force_close).await.expect("drain alive");
            conn.mark_forced();
            drop(conn);
        }
        // A panicking driver ends its task: fail, rather than wait forever.
        let report = tokio::select! {
            report = drain.drained() => report,
            ended = &mut driver => panic!("the drain driver ended: {ended:?}"),
        };
        assert_eq!(drain.phase(), Phase::Drained);
        // tokio's timers fire on whole milliseconds: a deadline in
        // nanoseconds fires up to 1 ms late.
        let tick = Duration::from_millis(1);
        assert!(
            report.grace <= timers.max_delay.get().saturating_add(tick),
            "{report:?}"
        );
        assert_eq!(report.force_closed, u64::from(stuck));
        // The whole drain stays within its worst case (+ the 2s bound on
        // force-closed connections), on the paused clock.
        let worst = timers
            .worst_case()
            .saturating_add(Duration::from_millis(100 * u64::from(new_conns)))
            .saturating_add(Duration::from_secs(2))
            .saturating_add(2 * tick);
        assert!(t0.elapsed() <= worst, "{:?} > {worst:?}", t0.elapsed());
    });
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn every_accepted_drain_config_drains_and_every_other_is_refused(
        drain in drain_config(),
        stuck in any::<bool>(),
        new_conns in 0u8..4,
    ) {
        let config = Config { drain, ..Config::default() };
        match (config.validate(), expected_refusal(&drain)) {
            (Ok(()), None) => full_drain(drain, stuck, new_conns),
            (Err(e), Some(key)) => {
                prop_assert_eq!(&e.key, key, "{}", e);
            }
            (got, want) => prop_assert!(false, "loader said {got:?}, expected a refusal of {want:?}"),
        }
    }
}

/// Defence in depth: timers far past the bound (a caller that skipped the
/// loader) still cannot panic the driver; before `deadline()` this
/// panicked with "overflow when adding duration to instant".
#[test]
fn timers_past_every_bound_never_panic_the_driver() {
    let huge = HumanDuration(Duration::MAX);
    let timers = DrainConfig {
        min_delay: HumanDuration(Duration::ZERO),
        quiet: huge,
        max_delay: HumanDuration::from_secs(1),
        timeout: huge,
        ..DrainConfig::default()
    };
    paused_runtime().block_on(async move {
        let drain = Drain::new(timers);
        let held = drain.connection();
        let mut driver = tokio::spawn(drain.clone().run());
        let mut rx = drain.subscribe();
        drain.trigger_exit("test");
        // `quiet` never ends: maxDelay (1s) does. A panicking driver ends
        // its task: fail, rather than wait forever.
        tokio::select! {
            closing = rx.wait_for(|s| s.phase >= Phase::Closing) => {
                closing.expect("drain alive");
            }
            ended = &mut driver => panic!("the drain driver ended: {ended:?}"),
        }
        // A `timeout` past any instant: Closing waits for the connection.
        tokio::time::sleep(Duration::from_secs(3_600)).await;
        assert!(!driver.is_finished(), "the driver is alive");
        assert_eq!(drain.phase(), Phase::Closing);
        drop(held);
        let report = drain.drained().await;
        assert_eq!(report.force_closed, 0);
    });
}
