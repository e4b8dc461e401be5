use std::io::Write;
use std::time::Instant;

fn main() {
    let started = Instant::now();
    env_logger::Builder::new()
        .filter_level(log::LevelFilter::Warn)
        .parse_env("DEVGATE_LOG")
        .format(|buf, record| {
            writeln!(
                buf,
                "devgate: {}: {}",
                record.level().as_str().to_lowercase(),
                record.args()
            )
        })
        .init();
    std::panic::set_hook(Box::new(|info| {
        let line = format!("devgate: error: internal error, please report: {info}");
        eprintln!("{}", devgate::policy::one_line(&line));
    }));
    let argv0 = std::env::args_os().next();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // Installed as `devgate-runtime`: the OCI runtime wrapper, for configs that name one path.
    let code = if devgate::wrapper::invoked_as_runtime(argv0.as_deref()) {
        devgate::wrapper::main(&argv, None, started)
    } else {
        devgate::cli::main(argv, started)
    };
    if devgate::probe::nvml::abandoned() {
        // An NVML call is still stuck on its thread: exit() would run the library's
        // destructors under it, and those may wait on it forever. Nothing devgate wrote
        // needs atexit: records are fsynced, stdout and stderr are flushed here.
        let _ = std::io::stdout().flush();
        let _ = std::io::stderr().flush();
        // SAFETY: _exit ends the process at once; no Rust state is used after it.
        unsafe { libc::_exit(code) }
    }
    std::process::exit(code);
}
