//! The agent's loop. Locally, every interval: has a decision or a cordon changed (the
//! decision log, the ledger)? Then, or every resync, ask devgate for its verdicts. Then
//! bring the cluster in step (condition, Events, rules, node taint) and the hook's file in
//! step with the cluster. The API server being away only delays the second half: the
//! gate keeps its last file, and the agent retries with back-off.

use crate::api::{Api, ApiError, ApiResult};
use crate::dra::{node_devices, List, NodeDevice, ResourceClaim, ResourceSlice};
use crate::inward::{self, file_taints, taints_here, Inward};
use crate::local::{Local, Stamp};
use crate::metrics::Shared;
use crate::node;
use crate::opts::Opts;
use crate::outward::{self, desired, list_rules, published_as};
use crate::report::{previous, Report};
use crate::verdicts::{self, Bad, NodeGpu, Verdicts};
use devgate::store::cluster::{self, ClusterTaints};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MAX_BACKOFF: Duration = Duration::from_secs(30);
const STATUS_EVERY: Duration = Duration::from_secs(10);
const LOCAL_POLL: Duration = Duration::from_secs(1);

pub struct Agent {
    opts: Opts,
    local: Arc<Local>,
    shared: Arc<Shared>,
    api: Option<Api>,
    bad: Vec<Bad>,
    gpus: usize,
    /// This node's GPUs, once devgate has answered: the only devices whose taints count.
    gpu_ids: Option<Vec<NodeGpu>>,
    stamp: Option<Stamp>,
    last_status: Option<Instant>,
    /// DRA's version, found once per connection (None inside: DRA or its taints are off).
    dra: Option<Option<&'static str>>,
    backoff: Duration,
    next_api: Instant,
    report: Report,
    /// What the hook's file holds, as this agent last wrote it (its time aside), and
    /// when it wrote it.
    written: Option<(ClusterTaints, u64)>,
    report_written: Option<(Report, Instant)>,
}

impl Agent {
    pub fn new(opts: Opts, local: Arc<Local>, shared: Arc<Shared>) -> Agent {
        let old = previous(&local.state_dir()).filter(|r| r.node == opts.node_name);
        let report = Report {
            node: opts.node_name.clone(),
            pid: std::process::id(),
            started_unix: now_unix(),
            published: old.map(|r| r.published).unwrap_or_default(),
            ..Report::default()
        };
        Agent {
            opts,
            local,
            shared,
            api: None,
            bad: Vec::new(),
            gpus: 0,
            gpu_ids: None,
            stamp: None,
            last_status: None,
            dra: None,
            backoff: Duration::from_secs(1),
            next_api: Instant::now(),
            report,
            written: None,
            report_written: None,
        }
    }

    /// The local look (a stat of two files) every second; the API server every interval,
    /// or at once when devgate's verdicts changed.
    pub async fn run(mut self) -> ! {
        loop {
            self.tick().await;
            tokio::time::sleep(LOCAL_POLL).await;
        }
    }

    pub async fn tick(&mut self) {
        self.look_locally().await;
        if Instant::now() >= self.next_api {
            match self.sync().await {
                Ok(()) => {
                    self.next_api = Instant::now() + self.opts.interval;
                    self.backoff = Duration::from_secs(1);
                    self.report.api_ok = true;
                    self.report.last_error = None;
                    self.report.last_sync_unix = now_unix();
                }
                Err(e) => {
                    log::warn!("API server: {e}; next try in {}s", self.backoff.as_secs());
                    self.report.api_ok = false;
                    self.report.last_error = Some(e.to_string());
                    self.report.api_errors += 1;
                    self.next_api = Instant::now() + self.backoff;
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                    if matches!(e, ApiError::Other(_) | ApiError::Timeout(_)) {
                        self.dra = None;
                    }
                }
            }
        }
        self.report.updated_unix = now_unix();
        self.report.bad_devices = self.bad.len();
        *self.shared.report.lock().unwrap() = self.report.clone();
        *self.shared.tick.lock().unwrap() = now_unix();
        self.write_report();
    }

    /// The status file, when it says something new or every STATUS_EVERY (doctor reads its
    /// age: a stopped agent shows).
    fn write_report(&mut self) {
        let mut same = self.report.clone();
        same.updated_unix = 0;
        if let Some((last, at)) = &self.report_written {
            if *last == same && at.elapsed() < STATUS_EVERY {
                return;
            }
        }
        let dir = self.local.state_dir();
        match cluster::write_status(&dir, &self.report) {
            Ok(()) => self.report_written = Some((same, Instant::now())),
            Err(e) => log::warn!("{e}"),
        }
    }

    /// Runs `devgate status` when a decision or cordon changed something, or at resync.
    async fn look_locally(&mut self) {
        let stamp = self.local.stamp();
        let due = self
            .last_status
            .is_none_or(|t| t.elapsed() >= self.opts.resync);
        if !due && self.stamp.as_ref() == Some(&stamp) {
            return;
        }
        let local = self.local.clone();
        let out = tokio::task::spawn_blocking(move || local.status_json()).await;
        let parsed = match out {
            Ok(Ok(text)) => verdicts::read(&text),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(format!("devgate status: {e}")),
        };
        self.last_status = Some(Instant::now());
        match parsed {
            Ok(Verdicts { bad, gpus, gpu_ids }) => {
                if bad != self.bad {
                    log::info!("devgate judges {} device(s) bad", bad.len());
                    // A new verdict is news: tell the API server now, not after a back-off.
                    self.next_api = Instant::now();
                }
                self.bad = bad;
                self.gpus = gpus;
                self.gpu_ids = Some(gpu_ids);
                self.stamp = Some(stamp);
            }
            // The last verdicts stand: a devgate that cannot answer clears nothing.
            Err(e) => {
                log::warn!("{e}");
                self.report.status_errors += 1;
            }
        }
    }

    async fn sync(&mut self) -> ApiResult<()> {
        if self.api.is_none() {
            let api = Api::connect(self.opts.kubeconfig.as_deref(), self.opts.api_timeout)
                .await
                .map_err(ApiError::Other)?;
            self.api = Some(api);
        }
        // Taken out while in use (the loop's other state changes meanwhile), put back after.
        let api = self.api.take().expect("connected");
        let r = self.sync_with(&api).await;
        self.api = Some(api);
        r
    }

    async fn sync_with(&mut self, api: &Api) -> ApiResult<()> {
        let node = node::get(api, &self.opts.node_name).await?;
        if self.dra.is_none() {
            let v = api.dra_version().await?;
            log::info!(
                "DRA device taints: {}",
                v.map_or("not served".to_string(), |v| format!("resource.k8s.io/{v}"))
            );
            self.dra = Some(v);
        }
        let version = self.dra.flatten();
        self.report.dra_api = version.map(|v| format!("resource.k8s.io/{v}"));
        let devices = match version {
            Some(v) => self.slices(api, v).await?,
            None => Vec::new(),
        };
        // The gate's file first, then devgate's rules: a failing optional call after them
        // (an Event, the node taint) never leaves the gate with stale taints.
        if let Some(v) = version {
            let rules = list_rules(api, v).await?;
            let found = taints_here(
                &rules,
                &devices,
                &self.opts.node_name,
                self.gpu_ids.as_deref(),
            );
            let claims = if found.is_empty() {
                Vec::new()
            } else {
                self.claims(api, v).await?
            };
            self.write_file(file_taints(&found, &claims));
            let want = desired(
                &self.bad,
                &devices,
                &self.opts.node_name,
                &self.opts.taint_key,
                self.opts.effect,
            );
            self.report.rules_wanted = want.len();
            self.report.rules = outward::apply(api, v, &self.opts.node_name, &rules, &want).await?;
        } else {
            self.report.rules = 0;
            self.report.rules_wanted = 0;
            self.write_file(Inward::default());
        }
        // The node taint before the condition: its patch is made at the Node's version
        // read above, which the status patch would move on.
        if self.opts.node_taint {
            let bad_gpus = (self.bad.iter())
                .filter(|b| b.class == devgate::model::class::Class::NvidiaGpu)
                .count();
            let on = devices.is_empty() && self.gpus > 0 && bad_gpus >= self.gpus;
            if node::set_taint(api, &node, &self.opts.taint_key, on).await? {
                log::info!(
                    "node taint {}: {}",
                    self.opts.taint_key,
                    if on { "set" } else { "removed" }
                );
            }
        }
        let now = rfc3339_now();
        let cond = node::condition(&self.bad, |b| {
            published_as(b, &devices).map(|d| format!("{}/{}/{}", d.driver, d.pool, d.device))
        });
        node::set_condition(api, &node, cond, &now).await?;
        self.events(api, &node, &now).await?;
        Ok(())
    }

    async fn slices(&self, api: &Api, v: &str) -> ApiResult<Vec<NodeDevice>> {
        let q = crate::api::query(&[
            (
                "fieldSelector",
                &format!("spec.nodeName={}", self.opts.node_name),
            ),
            ("resourceVersion", "0"),
        ]);
        let l: List<ResourceSlice> = api
            .get(&format!("/apis/resource.k8s.io/{v}/resourceslices{q}"))
            .await?;
        Ok(node_devices(
            &l.items,
            &self.opts.node_name,
            &self.opts.gpu_driver,
        ))
    }

    /// Every claim: asked only while a device here is tainted, to learn who tolerates it.
    async fn claims(&self, api: &Api, v: &str) -> ApiResult<Vec<ResourceClaim>> {
        let l: List<ResourceClaim> = api
            .get(&format!(
                "/apis/resource.k8s.io/{v}/resourceclaims?resourceVersion=0"
            ))
            .await?;
        Ok(l.items)
    }

    /// One Event per device that turned bad or healthy since the last publish.
    async fn events(&mut self, api: &Api, n: &node::Node, now: &str) -> ApiResult<()> {
        let current: Vec<(String, String)> = self
            .bad
            .iter()
            .map(|b| (b.key.clone(), b.code.as_str().to_string()))
            .collect();
        for b in &self.bad {
            if !self
                .report
                .published
                .iter()
                .any(|(k, c)| *k == b.key && c == b.code.as_str())
            {
                node::event(
                    api,
                    n,
                    true,
                    "DeviceUnhealthy",
                    &format!("devgate: {} is unhealthy: {}", b.name, b.reason),
                    now,
                )
                .await?;
            }
        }
        for (key, _) in &self.report.published {
            if !current.iter().any(|(k, _)| k == key) {
                node::event(
                    api,
                    n,
                    false,
                    "DeviceRecovered",
                    &format!("devgate: {key} is healthy again"),
                    now,
                )
                .await?;
            }
        }
        self.report.published = current;
        Ok(())
    }

    /// Called only after the cluster was read: the file's `written_unix` says the taints
    /// were seen so then. An unchanged file is rewritten every [`cluster::REFRESH_S`], so
    /// the hook can tell a file no agent confirms any more (`cluster_taints_max_age_s`).
    fn write_file(&mut self, found: Inward) {
        let mut file = inward::file(&self.opts.node_name, 0, found);
        self.report.inward_taints = file.taints.len();
        self.report.inward_overflow = file.overflow.clone();
        let now = now_unix();
        let changed = !matches!(&self.written, Some((last, _)) if *last == file);
        let fresh = (self.written.as_ref())
            .is_some_and(|(_, at)| now.saturating_sub(*at) < cluster::REFRESH_S);
        if !changed && fresh {
            return;
        }
        let dir = self.local.state_dir();
        let same = file.clone();
        file.written_unix = now;
        match cluster::write(&dir, &file) {
            Ok(()) => {
                let path = cluster::path(&dir);
                if changed {
                    log::info!(
                        "{}: {} cluster taint(s) for the gate{}",
                        path.display(),
                        file.taints.len(),
                        file.overflow.as_deref().map_or(String::new(), |o| format!(
                            "; overflowed: {}",
                            devgate::model::text::one_line(o)
                        ))
                    );
                }
                self.written = Some((same, now));
            }
            Err(e) => log::warn!("{e}"),
        }
    }
}

pub use devgate::model::clock::now_unix;

/// Now as RFC 3339 in UTC, as the API server writes times.
pub fn rfc3339_now() -> String {
    devgate::model::clock::rfc3339(now_unix())
}
