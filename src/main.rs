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
    devgate::cli::set_panic_hook();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let code = devgate::cli::main(argv, started);
    devgate::cli::exit(code)
}
