//! kubectl-kubegrace: `kubectl kubegrace check|status|resume|verify`. Exit status: 0 all good,
//! 1 a problem found (`check`) or a request failed (`verify`), 2 the command could not run.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use kubectl_kubegrace::{check, cluster, resume, status, verify};

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-kubegrace",
    bin_name = "kubectl kubegrace",
    version,
    about = "Check a kubegrace install, read its sidecars, verify that a rollout loses nothing"
)]
struct Cli {
    /// The kubeconfig (else KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context.
    #[arg(long, global = true)]
    context: Option<String>,
    /// The namespace (check: limit the workload checks to it; else the context's).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Operator up and leading, webhooks reachable with a matching caBundle, certificate,
    /// CRD, pods without their sidecar or with a stale one, Services around the sidecar,
    /// routes not accepted. Exit 1 on any problem, each with its fix.
    Check {
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
        /// The operator's namespace (default: found by the chart's labels anywhere).
        #[arg(long)]
        operator_namespace: Option<String>,
    },
    /// Per pod of a GraceRoute or Deployment: drain phase, in-flight requests, open
    /// connections, breakers, last drain (from the sidecar's admin port).
    Status {
        /// ROUTE, groute/ROUTE or deploy/NAME.
        target: String,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Resume the rollout the operator paused for a lossy drain (rollout.pauseOnDrainLoss):
    /// record the time on the route, so drains that ended before it do not pause it again,
    /// and unpause the route's Deployments that kubegrace paused (never one paused by
    /// someone else).
    Resume {
        /// ROUTE or groute/ROUTE.
        route: String,
    },
    /// Roll deploy/NAME under load from a Job in its namespace and count every failed
    /// request. Exit 1 when any failed.
    Verify {
        /// deploy/NAME.
        target: String,
        /// Requests per second (open loop).
        #[arg(long, default_value_t = 50.0)]
        rate: f64,
        /// Longest the load runs (lead-in, rollout and old pods gone must fit), e.g. 3m.
        #[arg(long, default_value = "3m", value_parser = humantime::parse_duration)]
        duration: Duration,
        #[arg(long, value_enum, default_value = "http1")]
        protocol: verify::Traffic,
        /// Path (and query) of each HTTP request.
        #[arg(long, default_value = "/")]
        path: String,
        /// Connections of the load generator (HTTP/1.1: requests in flight at most).
        #[arg(long, default_value_t = 16)]
        connections: usize,
        /// Deadline of one request.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        timeout: Duration,
        /// Load before the restart.
        #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
        lead_in: Duration,
        /// The kubegrace-loadgen image the Job runs.
        #[arg(long, default_value = verify::DEFAULT_LOADGEN_IMAGE)]
        loadgen_image: String,
        /// Keep the loadgen Job afterwards.
        #[arg(long)]
        keep_job: bool,
        /// Also write the run as JSON (the load summary, rollout duration and start, old
        /// pods' terminations): `make demo`'s report reads it; a CI job keeps it.
        #[arg(long, value_name = "FILE")]
        out: Option<std::path::PathBuf>,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `Ok(true)` passed, `Ok(false)` found a problem.
async fn run(cli: Cli) -> kubectl_kubegrace::Result<bool> {
    let target = cluster::Target {
        kubeconfig: cli.kubeconfig,
        context: cli.context,
    };
    let (client, context_ns) = target.client().await?;
    match cli.command {
        Command::Check {
            output,
            operator_namespace,
        } => {
            let scope = check::gather::Scope {
                operator_namespace,
                namespace: cli.namespace,
            };
            let snapshot = check::gather(&client, &scope).await?;
            let findings = check::judge(&snapshot, jiff::Timestamp::now());
            match output {
                Output::Text => print!("{}", check::text(&findings)),
                Output::Json => {
                    println!("{}", serde_json::to_string_pretty(&check::json(&findings))?)
                }
            }
            Ok(findings.iter().all(|f| f.ok))
        }
        Command::Status { target, output } => {
            let ns = cli.namespace.unwrap_or(context_ns);
            let subject = status::Subject::parse(&target)?;
            let (header, rows) = status::status(&client, &ns, &subject).await?;
            match output {
                Output::Text => print!("{}", status::table(&header, &rows)),
                Output::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({"subject": header, "pods": rows})
                    )?
                ),
            }
            Ok(true)
        }
        Command::Resume { route } => {
            let ns = cli.namespace.unwrap_or(context_ns);
            let name = match status::Subject::parse(&route)? {
                status::Subject::Route(name) => name,
                status::Subject::Deployment(_) | status::Subject::Rollout(_) => {
                    return Err(kubectl_kubegrace::Error::Invalid(format!(
                        "{route:?}: resume takes ROUTE or groute/ROUTE"
                    )));
                }
            };
            let plan = resume::resume(&client, &ns, &name).await?;
            print!("{}", resume::describe(&ns, &name, &plan));
            Ok(true)
        }
        Command::Verify {
            target,
            rate,
            duration,
            protocol,
            path,
            connections,
            timeout,
            lead_in,
            loadgen_image,
            keep_job,
            out,
        } => {
            let workload = match status::Subject::parse(&target)? {
                status::Subject::Deployment(d) => verify::Workload::Deployment(d),
                status::Subject::Rollout(r) => verify::Workload::Rollout(r),
                status::Subject::Route(_) => {
                    return Err(kubectl_kubegrace::Error::Invalid(format!(
                        "{target:?}: verify takes deploy/NAME or rollout/NAME"
                    )));
                }
            };
            if !(rate > 0.0 && rate <= 2000.0) {
                return Err(kubectl_kubegrace::Error::Invalid(
                    "--rate must be > 0 and at most 2000 per second".into(),
                ));
            }
            let opts = verify::Options {
                workload,
                namespace: cli.namespace.unwrap_or(context_ns),
                rate,
                duration,
                traffic: protocol,
                path,
                connections,
                timeout,
                loadgen_image,
                lead_in,
                keep_job,
            };
            let say = |s: &str| eprintln!("verify: {s}");
            let verdict = verify::verify(&client, &opts, &say).await?;
            if let Some(path) = out {
                let json = serde_json::to_string_pretty(&verdict.run)? + "\n";
                std::fs::write(&path, json).map_err(|source| kubectl_kubegrace::Error::Write {
                    path: path.display().to_string(),
                    source,
                })?;
            }
            print!("{}", verdict.table);
            let s = &verdict.run.summary;
            if verdict.passed() {
                println!(
                    "PASS: {} requests, none failed, rollout {:.1}s",
                    s.requests, verdict.run.rollout_s
                );
            } else {
                println!(
                    "FAIL: {} of {} requests failed during the rollout",
                    s.failed, s.requests
                );
            }
            Ok(verdict.passed())
        }
    }
}
