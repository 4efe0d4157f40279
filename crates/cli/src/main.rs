//! The `plusfs` binary (see the library's [`plusfs::main`]).

fn main() -> std::process::ExitCode {
    plusfs::main()
}
