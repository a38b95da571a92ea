//! The other half of the GraceRoute property tests: the same generated
//! routes with one value pushed past a bound (one of [`POISONS`] ways) must
//! be refused by the validate step with a message that starts with the
//! field's name. Generators and the accepted half are in [`super`].

use super::*;
/// Milliseconds of the duration at `ptr`.
fn ms_at(v: &Value, ptr: &str) -> u64 {
    v.pointer(ptr)
        .and_then(Value::as_str)
        .and_then(|t| {
            t.parse::<kubegrace_sidecar_api::config::HumanDuration>()
                .ok()
        })
        .map_or(0, |d| {
            u64::try_from(d.get().as_millis()).unwrap_or(u64::MAX)
        })
}

/// A duration past the 1h cap: within the pattern, or one an older CRD
/// stored (issue #34's overflow).
fn over_cap(big: u64) -> String {
    match big % 3 {
        0 => "99999h".into(),
        1 => "5124095576030431h".into(),
        _ => text(HOUR_MS + 1 + big % HOUR_MS, (big >> 8) as u8),
    }
}

/// An integer past `max` (or under `min` when `min > 0`), in `u32`.
fn past(min: u32, max: u32, big: u64) -> u64 {
    if min > 0 && big.is_multiple_of(4) {
        return 0;
    }
    u64::from(max) + 1 + big % (u64::from(u32::MAX) - u64::from(max))
}

/// The index of a route to poison (adds one when there is none).
fn some_route(v: &mut Value, k: usize) -> usize {
    let routes = v["spec"]["routes"].as_array_mut().expect("routes");
    if routes.is_empty() {
        routes.push(json!({"name": "zz-poison", "match": {}, "fallback": {}}));
    }
    k % routes.len()
}

/// `v[ptr]` as an object, made `{}` when absent (`ptr` is a JSON pointer
/// whose arrays exist).
fn object<'a>(v: &'a mut Value, ptr: &str) -> &'a mut Value {
    let mut at = v;
    for key in ptr.split('/').filter(|k| !k.is_empty()) {
        at = match key.parse::<usize>() {
            Ok(i) if at.is_array() => &mut at[i],
            _ => {
                if at.get(key).is_none_or(Value::is_null) {
                    at[key] = json!({});
                }
                &mut at[key]
            }
        };
    }
    at
}

const POISONS: usize = 52;

/// Pushes one value of `v` past its bound; returns the field the refusal
/// must name first.
fn poison(v: &mut Value, which: usize, k: usize, big: u64) -> String {
    const DRAIN: [&str; 6] = [
        "minDelay",
        "quiet",
        "maxDelay",
        "timeout",
        "websocketCloseWindow",
        "websocketCloseWait",
    ];
    const COUNTS: [(&str, u32, u32); 6] = [
        ("maxConcurrent", 1, MAX_CONCURRENT),
        ("maxQueue", 0, MAX_QUEUE),
        ("minRequests", 0, MAX_MIN_REQUESTS),
        ("consecutiveFailures", 0, MAX_CONSECUTIVE_FAILURES),
        ("halfOpenProbes", 1, MAX_HALF_OPEN_PROBES),
        ("minConcurrent", 1, MAX_CONCURRENT),
    ];
    const CB_TIMES: [&str; 4] = ["queueTimeout", "window", "openFor", "maxOpenFor"];
    let max_delay = ms_at(v, "/spec/drain/maxDelay");
    match which {
        0..=5 => {
            let f = DRAIN[which];
            v["spec"]["drain"][f] = json!(over_cap(big));
            format!("drain.{f}")
        }
        6 | 7 => {
            let f = if which == 6 { "quiet" } else { "minDelay" };
            let m = max_delay.min(HOUR_MS - 1);
            let d = &mut v["spec"]["drain"];
            d["maxDelay"] = json!(text(m, 0));
            d["minDelay"] = json!("0s");
            d["quiet"] = json!("0s");
            d[f] = json!(text(m + 1, big as u8));
            format!("drain.{f}")
        }
        8 => {
            let m = max_delay.max(1);
            v["spec"]["drain"]["maxDelay"] = json!(text(m, 0));
            v["spec"]["drain"]["timeout"] = json!(text(HOUR_MS - m + 1, big as u8));
            "drain.timeout".into()
        }
        9 => {
            v["spec"]["drain"]["timeout"] = json!("0s");
            "drain.timeout".into()
        }
        10..=12 => {
            let i = some_route(v, k);
            let t = match which {
                10 => text(HOUR_MS - max_delay + 1, big as u8),
                11 => "0s".into(),
                _ => over_cap(big),
            };
            v["spec"]["routes"][i]["timeout"] = json!(t);
            format!("routes[{i}].timeout")
        }
        13..=18 => {
            let (f, min, max) = COUNTS[which - 13];
            object(v, "/spec/circuitBreaker")[f] = json!(past(min, max, big));
            format!("circuitBreaker.{f}")
        }
        19 => {
            object(v, "/spec/circuitBreaker")["errorRatio"] =
                json!(if big.is_multiple_of(2) { 1.5 } else { -0.5 });
            "circuitBreaker.errorRatio".into()
        }
        20..=23 => {
            let f = CB_TIMES[which - 20];
            object(v, "/spec/circuitBreaker")[f] = json!(over_cap(big));
            format!("circuitBreaker.{f}")
        }
        24 => {
            let routes = v["spec"]["routes"].as_array_mut().expect("routes");
            for i in routes.len()..=MAX_ROUTES {
                routes.push(json!({"name": format!("zz-{i}")}));
            }
            "routes".into()
        }
        25 | 26 => {
            let i = some_route(v, k);
            let name = if which == 25 {
                "z".repeat(MAX_ROUTE_NAME + 1)
            } else {
                "Not_A_Name".into()
            };
            v["spec"]["routes"][i]["name"] = json!(name);
            format!("routes[{i}].name")
        }
        27 | 28 => {
            let i = some_route(v, k);
            let m = object(v, &format!("/spec/routes/{i}/match"));
            m.as_object_mut().map(|m| m.remove("path"));
            m["pathPrefix"] = json!(if which == 27 {
                format!("/{}", "a".repeat(MAX_PATH))
            } else {
                "/caf\u{e9}".into()
            });
            format!("routes[{i}].match.pathPrefix")
        }
        29 | 30 => {
            let i = some_route(v, k);
            object(v, &format!("/spec/routes/{i}/match"))["host"] = json!(if which == 29 {
                "h".repeat(MAX_HOST + 1)
            } else {
                "a b.example".into()
            });
            format!("routes[{i}].match.host")
        }
        31 | 32 => {
            let i = some_route(v, k);
            v["spec"]["routes"][i]
                .as_object_mut()
                .map(|r| r.remove("retry"));
            let m = object(v, &format!("/spec/routes/{i}/match"));
            if which == 31 {
                m["methods"] = json!(vec!["GET"; MAX_METHODS + 1]);
                format!("routes[{i}].match.methods")
            } else {
                m["methods"] = json!(["G".repeat(MAX_METHOD + 1)]);
                format!("routes[{i}].match.methods[0]")
            }
        }
        33 => {
            let i = some_route(v, k);
            v["spec"]["routes"][i]["failOn"] = json!(vec!["5xx"; MAX_FAIL_ON + 1]);
            format!("routes[{i}].failOn")
        }
        34..=37 => {
            let i = some_route(v, k);
            let fb = object(v, &format!("/spec/routes/{i}/fallback"));
            let (f, value) = match which {
                34 => (
                    "status",
                    json!(if big.is_multiple_of(2) {
                        big % 200
                    } else {
                        600 + big % 64_936
                    }),
                ),
                35 => ("contentType", json!("t".repeat(MAX_CONTENT_TYPE + 1))),
                36 => ("contentType", json!("text/plain\u{1}")),
                _ => ("body", json!("b".repeat(MAX_FALLBACK_BODY + 1))),
            };
            fb[f] = value;
            format!("routes[{i}].fallback.{f}")
        }
        38 => {
            let routes = v["spec"]["routes"].as_array_mut().expect("routes");
            while routes.len() < 2 {
                routes.push(json!({"name": format!("zz-{}", routes.len())}));
            }
            for (i, r) in routes.iter_mut().enumerate() {
                let n = match i {
                    0 => MAX_FALLBACK_BODIES,
                    1 => 1,
                    _ => 0,
                };
                r["fallback"] = json!({"body": "b".repeat(n)});
            }
            "routes[].fallback.body".into()
        }
        39 => {
            let i = some_route(v, k);
            object(v, &format!("/spec/routes/{i}/circuitBreaker"))["consecutiveFailures"] =
                json!(past(0, MAX_CONSECUTIVE_FAILURES, big));
            format!("routes[{i}].circuitBreaker.consecutiveFailures")
        }
        40 => {
            v["metadata"]["name"] = json!("n".repeat(MAX_ROUTE_OBJECT_NAME + 1 + (k % 200)));
            "metadata.name".into()
        }
        41 | 42 => {
            let bad = [
                json!("00%"),
                json!("05%"),
                json!("101%"),
                json!("1000%"),
                json!(-1),
                json!(MAX_ROLLOUT_PODS + 1),
                json!(i32::MAX),
            ];
            let f = if which == 41 {
                "maxSurge"
            } else {
                "maxUnavailable"
            };
            object(v, "/spec/rollout")[f] = bad[k % bad.len()].clone();
            format!("rollout.{f}")
        }
        43 => {
            let bad = [-1, MAX_MIN_READY_SECONDS + 1, i32::MAX];
            object(v, "/spec/rollout")["minReadySeconds"] = json!(bad[k % bad.len()]);
            "rollout.minReadySeconds".into()
        }
        44 => {
            let bad = [
                json!(0),
                json!(-1),
                json!(MAX_GRACE_SECONDS + 1),
                json!(i32::MAX),
                json!("forever"),
            ];
            object(v, "/spec/rollout")["terminationGracePeriodSeconds"] =
                bad[k % bad.len()].clone();
            "rollout.terminationGracePeriodSeconds".into()
        }
        45..=47 => {
            let (f, value) = match which {
                45 => (
                    "minPerSecond",
                    json!(past(0, MAX_RETRY_MIN_PER_SECOND, big)),
                ),
                46 => (
                    "maxBodyBytes",
                    json!(MAX_RETRY_BODY_BYTES + 1 + big % (1 << 40)),
                ),
                _ => (
                    "ratio",
                    json!(if big.is_multiple_of(2) { 1.5 } else { -0.1 }),
                ),
            };
            object(v, "/spec/retryBudget")[f] = value;
            format!("retryBudget.{f}")
        }
        48 => {
            v["spec"]["ports"] = json!([]);
            "ports".into()
        }
        49 => {
            v["spec"]["ports"] = json!([{"name": "a"}, {"name": "b"}]);
            "ports".into()
        }
        50 => {
            v["spec"]["ports"][0]["name"] = json!("p".repeat(MAX_PORT_NAME + 1));
            "ports[0].name".into()
        }
        _ => {
            v["spec"]["targetRef"]["name"] = json!("t".repeat(MAX_TARGET_NAME + 1));
            "targetRef.name".into()
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn routes_past_a_bound_are_refused_naming_the_field(
        mut v in route(),
        which in 0..POISONS,
        k in any::<usize>(),
        big in any::<u64>(),
    ) {
        fit_grace(&mut v);
        let field = poison(&mut v, which, k, big);
        let r = decode(&v);
        let err = match budget_and_config(&r, &[&target(&v)]) {
            Ok(_) => return Err(TestCaseError::fail(format!("{field}: accepted\n{v}"))),
            Err(e) => e,
        };
        prop_assert!(
            err.message.starts_with(&format!("{field}: ")),
            "{field}: {}: {}", err.reason, err.message
        );
        // A condition message has at most 32768 characters.
        prop_assert!(err.message.len() < 1024, "{}", err.message.len());
    }
}
