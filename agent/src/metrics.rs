//! `/metrics` (devgate's own metrics, as `devgate metrics` writes them, then the agent's)
//! and `/healthz`, on a plain HTTP listener: one request at a time, each bounded in size
//! and time, since Prometheus scrapes a node every few seconds at most.

use crate::local::Local;
use crate::report::{metrics, Report};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub struct Shared {
    pub report: Mutex<Report>,
    /// When the main loop last went round (unix seconds): `/healthz` fails when it stopped.
    pub tick: Mutex<u64>,
}

pub fn serve(listener: TcpListener, local: Arc<Local>, shared: Arc<Shared>) {
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            if let Err(e) = answer(conn, &local, &shared) {
                log::debug!("metrics: {e}");
            }
        }
    });
}

fn answer(mut conn: TcpStream, local: &Local, shared: &Shared) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.set_write_timeout(Some(Duration::from_secs(10)))?;
    let mut buf = [0u8; 2048];
    let n = conn.read(&mut buf)?;
    let head = String::from_utf8_lossy(&buf[..n]);
    let path = head.split_whitespace().nth(1).unwrap_or("");
    let (code, body) = match path {
        "/metrics" => {
            let mine = metrics(&shared.report.lock().unwrap().clone());
            match local.metrics_text() {
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
