//! Configuration reload without dropping a connection.
//!
//! The file is polled once a second (mtime, inode, size, following
//! symlinks: a ConfigMap volume swaps its `..data` symlink, so the inode
//! behind the path changes even when the mtime does not) and re-read on
//! SIGHUP. The path is polled, not a directory watched, so a file (or its
//! whole directory) that does not exist at start is picked up whenever it
//! appears; until then the sidecar runs on defaults plus flags. The new config is laid under the same flag/environment layer as
//! at start and swapped in atomically: new requests see it, requests in
//! flight keep the snapshot they started with.
//!
//! What cannot change in place (sockets, the upstream pool, switching
//! between HTTP and raw TCP) keeps its old value and is reported as "needs
//! restart". An invalid file keeps the last good config and says why.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;

use crate::cli::{self, Overrides};
use crate::config::{Config, Protocol};
use crate::state::{ConfigStatus, Live, Shared};

/// Asks the watcher to re-read the file now (SIGHUP,
/// [`crate::Sidecar::reload`]). A reload is never a stop (see
/// [`crate::stop`]); cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Reload(Arc<Notify>);

impl Reload {
    /// Re-read the file now. Asked while the watcher is busy, it is kept
    /// for the watcher's next look (one permit), never lost.
    pub fn request(&self) {
        self.0.notify_one();
    }

    async fn requested(&self) {
        self.0.notified().await;
    }
}

/// How often the file is looked at.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// What identifies one version of the file on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint {
    modified: Option<SystemTime>,
    inode: u64,
    device: u64,
    len: u64,
}

fn fingerprint(path: &Path) -> Option<Fingerprint> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(Fingerprint {
        modified: meta.modified().ok(),
        inode: meta.ino(),
        device: meta.dev(),
        len: meta.len(),
    })
}

/// Watches `file` and reloads on change or when `reload` is requested,
/// forever.
pub(crate) async fn watch(
    shared: Arc<Shared>,
    file: PathBuf,
    overrides: Overrides,
    reload: Reload,
) {
    let mut last = fingerprint(&file);
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => false,
            _ = reload.requested() => true,
        };
        let now = fingerprint(&file);
        if !forced && now == last {
            continue;
        }
        if now.is_none() && !forced {
            // A ConfigMap update briefly has no file behind the link; wait
            // for the new one rather than reporting an error.
            continue;
        }
        last = now;
        let _ = self::reload(&shared, &file, &overrides);
    }
}

/// The config file now in force has `keys` this release skipped: the
/// metric and `/config` say so (the warning is logged where the file was read).
pub fn note_unknown_keys(shared: &Shared, keys: &[String]) {
    shared.metrics.config_unknown_keys(keys.len());
    shared.update_status(|s| {
        s.unknown_keys = keys
            .iter()
            .take(crate::config_keys::MAX_NAMED)
            .cloned()
            .collect();
    });
}

/// Re-reads the file and applies it. On error the config in force stays.
/// Keys this release does not know are skipped with a warning and counted;
/// every known key is checked as before.
pub fn reload(shared: &Shared, file: &Path, overrides: &Overrides) -> crate::Result<Vec<String>> {
    match cli::load_file(Some(file), overrides) {
        Ok(loaded) => {
            let needs_restart = apply(shared, loaded.config);
            shared.metrics.reload(true);
            cli::warn_unknown(file, &loaded.unknown_keys);
            note_unknown_keys(shared, &loaded.unknown_keys);
            shared.update_status(|s| {
                s.reloads += 1;
                s.last_reload = Some(ConfigStatus::stamp());
                s.last_error = None;
                s.file_missing = false;
                s.needs_restart = needs_restart.clone();
            });
            if needs_restart.is_empty() {
                tracing::info!(file = %file.display(), "config reloaded");
            } else {
                tracing::warn!(
                    file = %file.display(),
                    keys = ?needs_restart,
                    "config reloaded; these keys changed but need a restart and keep their old values"
                );
            }
            Ok(needs_restart)
        }
        Err(err) => {
            shared.metrics.reload(false);
            let message = err.to_string();
            tracing::error!(file = %file.display(), error = %message, "config reload refused; the last good config stays in force");
            shared.update_status(|s| {
                s.failed_reloads += 1;
                s.last_error = Some(message);
            });
            Err(err)
        }
    }
}

/// The settings that apply only at start and changed: each new value is
/// put back to the one in force and its key named.
#[derive(Default)]
struct NeedsRestart(Vec<String>);

impl NeedsRestart {
    fn keep_old<T: PartialEq + Clone>(&mut self, key: &str, next: &mut T, old: &T) {
        if next != old {
            self.0.push(key.to_string());
            *next = old.clone();
        }
    }
}

/// Swaps in `next`, keeping what cannot change without a restart. Returns
/// the keys that changed but were not applied.
pub fn apply(shared: &Shared, mut next: Config) -> Vec<String> {
    let old = shared.live.load_full();
    let mut needs_restart = NeedsRestart::default();
    let was = &old.config;
    needs_restart.keep_old("listen", &mut next.listen, &was.listen);
    needs_restart.keep_old("upstream", &mut next.upstream, &was.upstream);
    needs_restart.keep_old("upstreams", &mut next.upstreams, &was.upstreams);
    needs_restart.keep_old("workers", &mut next.workers, &was.workers);
    needs_restart.keep_old("listenMode", &mut next.listen_mode, &was.listen_mode);
    needs_restart.keep_old("admin", &mut next.admin, &was.admin);
    needs_restart.keep_old("upstreamPool", &mut next.upstream_pool, &was.upstream_pool);
    // Set on the listening socket when it was bound.
    needs_restart.keep_old(
        "proxy.deferAccept",
        &mut next.proxy.defer_accept,
        &was.proxy.defer_accept,
    );
    // auto/http1/http2 apply to new connections; moving to or from raw TCP
    // changes what the listener does.
    if next.protocol != old.config.protocol
        && (next.protocol == Protocol::Tcp || old.config.protocol == Protocol::Tcp)
    {
        needs_restart.0.push("protocol".to_string());
        next.protocol = old.config.protocol;
    }
    let routes = old.routes.reconfigure(&next.routes);
    shared.drain.set_timers(next.drain);
    shared.live.store(Arc::new(Live {
        config: next,
        routes,
    }));
    needs_restart.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HumanDuration;
    use crate::testing::{config_file, temp_dir};

    fn shared(config: Config) -> Arc<Shared> {
        Shared::new(config, None).expect("shared state")
    }

    #[test]
    fn a_good_file_applies_and_flags_still_win() {
        let file = config_file(
            "reload",
            "good",
            "drain: {minDelay: 1s, quiet: 1s}\nlimits: {maxRequestBodyBytes: 10}\n",
        );
        let overrides = Overrides {
            drain_quiet: Some(HumanDuration::from_millis(250)),
            ..Overrides::default()
        };
        let shared = shared(Config::default());
        let needs = reload(&shared, &file, &overrides).expect("reload");
        assert!(needs.is_empty());
        let live = shared.live.load();
        assert_eq!(live.config.drain.min_delay, HumanDuration::from_secs(1));
        assert_eq!(
            live.config.drain.quiet,
            HumanDuration::from_millis(250),
            "flag wins on reload too"
        );
        assert_eq!(live.config.limits.max_request_body_bytes, 10);
        assert_eq!(shared.drain.timers().min_delay, HumanDuration::from_secs(1));
        assert_eq!(shared.status().reloads, 1);
    }

    #[test]
    fn a_bad_file_keeps_the_last_good_config_and_says_why() {
        let file = config_file("reload", "bad", "drain: {timeout: 0s}\n");
        let shared = shared(Config::default());
        assert!(reload(&shared, &file, &Overrides::default()).is_err());
        assert_eq!(shared.live.load().config, Config::default());
        let status = shared.status();
        assert_eq!(status.failed_reloads, 1);
        assert!(
            status
                .last_error
                .as_deref()
                .unwrap_or("")
                .contains("drain.timeout"),
            "{status:?}"
        );
        let mut out = String::new();
        shared.metrics.render(&shared.drain, &mut out);
        assert!(
            out.contains("kubegrace_config_reloads_total{result=\"error\"} 1"),
            "{out}"
        );
    }

    #[test]
    fn a_file_past_a_bound_keeps_the_last_good_config() {
        let file = config_file("reload", "huge", "drain: {quiet: 5124095576030431h}\n");
        let shared = shared(Config::default());
        let err = reload(&shared, &file, &Overrides::default()).expect_err("past the bound");
        assert!(err.to_string().contains("drain.quiet"), "{err}");
        assert_eq!(shared.live.load().config, Config::default());
        assert_eq!(shared.drain.timers(), Config::default().drain);
        assert_eq!(shared.status().failed_reloads, 1);
    }

    #[test]
    fn socket_changes_need_a_restart() {
        let file = config_file(
            "reload",
            "restart",
            "upstream: 127.0.0.1:9999\nadmin: 127.0.0.1:15021\ndrain: {timeout: 5s}\n\
             proxy: {deferAccept: false, http1FastPath: false}\n",
        );
        let shared = shared(Config::default());
        let needs = reload(&shared, &file, &Overrides::default()).expect("reload");
        assert_eq!(
            needs,
            vec![
                "upstream".to_string(),
                "admin".to_string(),
                "proxy.deferAccept".to_string()
            ]
        );
        let live = shared.live.load();
        assert_eq!(
            live.config.upstream,
            Config::default().upstream,
            "old value stays"
        );
        assert_eq!(
            live.config.drain.timeout,
            HumanDuration::from_secs(5),
            "the rest applies"
        );
        assert!(live.config.proxy.defer_accept, "set on the socket at bind");
        assert!(
            !live.config.proxy.http1_fast_path,
            "new connections take it"
        );
        assert_eq!(shared.status().needs_restart.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_configmap_style_symlink_swap_is_noticed() {
        let dir = temp_dir("reload", "symlink");
        let v1 = dir.join("v1");
        let v2 = dir.join("v2");
        std::fs::create_dir_all(&v1).expect("v1");
        std::fs::create_dir_all(&v2).expect("v2");
        std::fs::write(v1.join("config.yaml"), "drain: {timeout: 7s}\n").expect("write");
        std::fs::write(v2.join("config.yaml"), "drain: {timeout: 9s}\n").expect("write");
        let data = dir.join("..data");
        std::os::unix::fs::symlink(&v1, &data).expect("link");
        let file = dir.join("config.yaml");
        std::os::unix::fs::symlink(data.join("config.yaml"), &file).expect("link");

        let shared = shared(cli::load(Some(&file), &Overrides::default()).expect("load"));
        let task = tokio::spawn(watch(
            shared.clone(),
            file.clone(),
            Overrides::default(),
            Reload::default(),
        ));
        // Let the watcher take its first look (virtual time: no real wait).
        tokio::time::sleep(POLL_INTERVAL / 2).await;
        // Swap the ..data link atomically, the way the kubelet does.
        let tmp = dir.join("..data_tmp");
        std::os::unix::fs::symlink(&v2, &tmp).expect("link");
        std::fs::rename(&tmp, &data).expect("swap");
        for _ in 0..20 {
            if shared.status().reloads > 0 {
                break;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        assert_eq!(
            shared.live.load().config.drain.timeout,
            HumanDuration::from_secs(9)
        );
        task.abort();
    }
}
