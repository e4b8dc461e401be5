use std::time::Instant;

fn main() {
    let started = Instant::now();
    devgate::cli::init_logging();
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
