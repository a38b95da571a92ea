fn main() {
    eprintln!("kubegrace-operator: under construction");
    std::process::exit(1);
}
