fn main() -> std::process::ExitCode {
    producers::gateway_main()
}
