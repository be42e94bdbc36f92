fn main() -> std::process::ExitCode {
    producers::main()
}
