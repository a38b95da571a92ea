fn main() {
    eprintln!("kubegrace-sidecar: under construction");
    std::process::exit(1);
}
