//! `/metrics` (devgate's own metrics, as `devgate metrics` writes them, then the agent's)
//! and `/healthz`, on a plain HTTP listener: each connection on a thread of its own (at
//! most MAX_CONNECTIONS at once; more are closed unanswered), each request bounded in size
//! and time, so a client that connects and says nothing never holds up the liveness
//! probe. `devgate metrics` runs for one request at a time.

use crate::local::Local;
use crate::report::{metrics, Report};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Connections served at once; past it a new one is closed at once.
const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send its request.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);

pub struct Shared {
    pub report: Mutex<Report>,
    /// Held while `devgate metrics` runs: one at a time, whoever scrapes.
    pub metrics_run: Mutex<()>,
    /// When the main loop last went round (unix seconds): `/healthz` fails when it stopped.
    pub tick: Mutex<u64>,
}

/// Serves on `listener`; a client has `read_timeout` ([`READ_TIMEOUT`]) to send its request.
pub fn serve(
    listener: TcpListener,
    local: Arc<Local>,
    shared: Arc<Shared>,
    read_timeout: Duration,
) {
    let open = Arc::new(AtomicUsize::new(0));
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                open.fetch_sub(1, Ordering::SeqCst);
                log::debug!("metrics: more than {MAX_CONNECTIONS} connections; one closed");
                continue;
            }
            let (local, shared, mine) = (local.clone(), shared.clone(), open.clone());
            let spawned = std::thread::Builder::new()
                .name("metrics-conn".into())
                .spawn(move || {
                    if let Err(e) = answer(conn, &local, &shared, read_timeout) {
                        log::debug!("metrics: {e}");
                    }
                    mine.fetch_sub(1, Ordering::SeqCst);
                });
            if let Err(e) = spawned {
                log::warn!("metrics: no thread for a connection: {e}");
                open.fetch_sub(1, Ordering::SeqCst);
            }
        }
    });
}

fn answer(
    mut conn: TcpStream,
    local: &Local,
    shared: &Shared,
    read_timeout: Duration,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(read_timeout))?;
    conn.set_write_timeout(Some(Duration::from_secs(10)))?;
    let mut buf = [0u8; 2048];
    let n = conn.read(&mut buf)?;
    let head = String::from_utf8_lossy(&buf[..n]);
    let path = head.split_whitespace().nth(1).unwrap_or("");
    let (code, body) = match path {
        "/metrics" => {
            let mine = metrics(&shared.report.lock().unwrap().clone());
            let one_run = shared.metrics_run.lock().unwrap_or_else(|p| p.into_inner());
            let devgate = local.metrics_text();
            drop(one_run);
            match devgate {
                Ok(devgate) => ("200 OK", format!("{devgate}{mine}")),
                // The agent's own families still answer; the failure is in them.
                Err(e) => {
                    log::warn!("devgate metrics: {e}");
                    ("200 OK", mine)
                }
            }
        }
        "/healthz" => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let tick = *shared.tick.lock().unwrap();
            if now.saturating_sub(tick) < 300 {
                ("200 OK", "ok\n".to_string())
            } else {
                (
                    "503 Service Unavailable",
                    "the agent's loop has stopped\n".to_string(),
                )
            }
        }
        _ => ("404 Not Found", "not found\n".to_string()),
    };
    let ctype = "text/plain; version=0.0.4; charset=utf-8";
    write!(conn, "HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;

    fn get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<String> {
        let mut c = TcpStream::connect(addr)?;
        // Only a bound on a server that never answers: a failure, not a measurement.
        c.set_read_timeout(Some(Duration::from_secs(60)))?;
        write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")?;
        let mut line = String::new();
        std::io::BufReader::new(c).read_line(&mut line)?;
        Ok(line)
    }

    #[test]
    fn a_client_that_sends_nothing_does_not_hold_up_healthz() {
        let root =
            std::env::temp_dir().join(format!("devgate-agent-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let root_s = root.display().to_string();
        let args = ["--node-name", "n1", "--host-root", root_s.as_str()].map(String::from);
        let o = crate::opts::parse(&args, |_| None).unwrap();
        let local = Arc::new(Local::new(&o).unwrap());
        let shared = Arc::new(Shared {
            report: Mutex::new(Report::default()),
            metrics_run: Mutex::new(()),
            tick: Mutex::new(crate::sync::now_unix()),
        });
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // Silent clients are waited for an hour: a server that served one connection at a
        // time would answer /healthz only after them, and the request below would fail.
        serve(listener, local, shared, Duration::from_secs(3600));
        let _idle: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let line = get(addr, "/healthz").expect("healthz answers while others stall");
        assert!(line.starts_with("HTTP/1.1 200"), "{line}");
        // An empty request (the peer closed at once) is answered, not a panic.
        drop(TcpStream::connect(addr).unwrap());
        assert!(get(addr, "/nope").unwrap().contains("404"));
        std::fs::remove_dir_all(&root).ok();
    }
}
