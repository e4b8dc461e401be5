use std::io::Write;
use std::time::Instant;

fn main() {
    let started = Instant::now();
    // The NVML query process (probe::nvidia::nvml::isolate) forks one child per GPU, so it
    // runs before anything could start a thread.
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() == Some(std::ffi::OsStr::new(devgate::NVML_QUERY_ARG)) {
        devgate::serve_nvml_query(&args.collect::<Vec<_>>());
    }
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
    devgate::cli::set_panic_hook();
    let argv0 = std::env::args_os().next();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // Installed as `devgate-runtime`: the OCI runtime wrapper, for configs that name one path.
    let code = if devgate::wrapper::invoked_as_runtime(argv0.as_deref()) {
        devgate::wrapper::main(&argv, None, started)
    } else {
        devgate::cli::main(argv, started)
    };
    devgate::cli::exit(code)
}
