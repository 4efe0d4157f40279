//! The `plusfs` command as the integration tests start it (`plusfs::main`, built with the
//! server's failpoints).

fn main() -> std::process::ExitCode {
    plusfs::main()
}
