//! kubegrace-operator: parses the command line; the library does the work.

use clap::Parser;
use kube::CustomResourceExt;
use kubegrace_operator::cli::{Cli, Command};
use kubegrace_operator::crd::GraceRoute;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => match serde_norway::to_string(&GraceRoute::crd()) {
            Ok(yaml) => {
                print!("{yaml}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("kubegrace-operator: rendering the CRD: {e}");
                std::process::ExitCode::FAILURE
            }
        },
        Command::Run(args) => kubegrace_operator::run::main(*args),
        Command::WebhookCheck(a) => {
            kubegrace_operator::webhook_check::main(&a.namespace, a.timeout.get())
        }
    }
}
