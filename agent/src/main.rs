//! devgate-agent: devgate's node agent (docs/cluster.md). It publishes devgate's verdicts
//! where the scheduler looks and passes the cluster's device taints to the gate, through
//! files on the node. It is a program of its own so that the hook links no Kubernetes
//! client.

mod api;
mod local;
mod metrics;
mod names;
mod node;
mod opts;
mod outward;
mod report;
mod sync;

// The readers of the cluster's objects and of devgate's status: a library, so the fuzz
// targets (fuzz/) reach them without the Kubernetes client.
use devgate_agent::{dra, inward, verdicts};

use std::sync::{Arc, Mutex};

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match opts::parse(&args, |k| std::env::var(k).ok()) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("devgate-agent: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(opts) {
        eprintln!("devgate-agent: {e}");
        std::process::exit(1);
    }
}

fn run(opts: opts::Opts) -> Result<(), String> {
    let local = Arc::new(local::Local::new(&opts)?);
    let listener = std::net::TcpListener::bind(&opts.metrics_address)
        .map_err(|e| format!("--metrics-address {}: {e}", opts.metrics_address))?;
    let shared = Arc::new(metrics::Shared {
        report: Mutex::new(Default::default()),
        metrics_run: Mutex::new(()),
        tick: Mutex::new(sync::now_unix()),
    });
    metrics::serve(
        listener,
        local.clone(),
        shared.clone(),
        metrics::READ_TIMEOUT,
    );
    log::info!(
        "devgate-agent on node {}: devgate's state in {}, taint {}:{}, metrics on {}",
        opts.node_name,
        local.state_dir().display(),
        opts.taint_key,
        opts.effect.as_str(),
        opts.metrics_address
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    rt.block_on(sync::Agent::new(opts, local, shared).run())
}
