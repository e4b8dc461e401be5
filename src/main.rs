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
    let argv: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(devgate::cli::main(argv, started));
}
