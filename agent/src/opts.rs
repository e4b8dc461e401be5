//! The agent's command line. Every flag has an environment twin only where the DaemonSet
//! needs one (NODE_NAME from the downward API, KUBECONFIG as kubectl reads it).

use std::path::PathBuf;
use std::time::Duration;

/// What a DeviceTaintRule devgate creates does to the scheduler (KEP-5055).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    None,
    NoSchedule,
    NoExecute,
}

impl Effect {
    pub fn parse(s: &str) -> Option<Effect> {
        match s {
            "None" => Some(Effect::None),
            "NoSchedule" => Some(Effect::NoSchedule),
            "NoExecute" => Some(Effect::NoExecute),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Effect::None => "None",
            Effect::NoSchedule => "NoSchedule",
            Effect::NoExecute => "NoExecute",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Opts {
    pub node_name: String,
    pub kubeconfig: Option<PathBuf>,
    pub host_root: PathBuf,
    pub devgate_config: Option<PathBuf>,
    pub devgate: Option<PathBuf>,
    pub taint_key: String,
    pub effect: Effect,
    pub node_taint: bool,
    pub interval: Duration,
    pub resync: Duration,
    pub metrics_address: String,
    pub api_timeout: Duration,
    /// The DRA driver whose devices name this node's GPUs (`--gpu-driver`).
    pub gpu_driver: String,
}

pub const USAGE: &str =
    "usage: devgate-agent --node-name NAME [--kubeconfig PATH] [--host-root PATH]
       [--devgate-config PATH] [--devgate PATH] [--taint-key KEY]
       [--effect None|NoSchedule|NoExecute] [--node-taint] [--interval SECONDS]
       [--resync SECONDS] [--metrics-address ADDR] [--api-timeout SECONDS]
       [--gpu-driver NAME]
--interval: how often the agent reads the cluster's taints (default 10); a new verdict is
published at once. --resync: how often it asks devgate again with nothing changed (30).
--gpu-driver: the DRA driver whose devices are this node's GPUs (gpu.nvidia.com); only
its devices' uuid and pciBusID name a GPU.
devgate's node agent: publishes devgate's device verdicts to the cluster (DeviceTaintRules,
the node condition DevgateDeviceFault, Events) and writes the cluster's device taints
where the hook reads them. See docs/cluster.md.";

/// Parses `args` (without the program name); `env` looks a variable up.
pub fn parse(args: &[String], env: impl Fn(&str) -> Option<String>) -> Result<Opts, String> {
    let mut o = Opts {
        node_name: env("NODE_NAME").unwrap_or_default(),
        kubeconfig: env("KUBECONFIG")
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
        host_root: PathBuf::from("/"),
        devgate_config: None,
        devgate: None,
        taint_key: "devgate.io/unhealthy".into(),
        effect: Effect::NoSchedule,
        node_taint: false,
        interval: Duration::from_secs(10),
        resync: Duration::from_secs(30),
        metrics_address: "0.0.0.0:9478".into(),
        api_timeout: Duration::from_secs(10),
        gpu_driver: "gpu.nvidia.com".into(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--node-taint" {
            o.node_taint = true;
            continue;
        }
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.into());
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?
            .clone();
        match flag.as_str() {
            "--node-name" => o.node_name = value,
            "--kubeconfig" => o.kubeconfig = Some(value.into()),
            "--host-root" => o.host_root = value.into(),
            "--devgate-config" => o.devgate_config = Some(value.into()),
            "--devgate" => o.devgate = Some(value.into()),
            "--taint-key" => o.taint_key = value,
            "--effect" => {
                o.effect = Effect::parse(&value).ok_or_else(|| {
                    format!("--effect {value:?}: expected None, NoSchedule or NoExecute")
                })?
            }
            "--interval" => o.interval = seconds(flag, &value)?,
            "--resync" => o.resync = seconds(flag, &value)?,
            "--api-timeout" => o.api_timeout = seconds(flag, &value)?,
            "--metrics-address" => o.metrics_address = value,
            "--gpu-driver" => o.gpu_driver = value,
            _ => return Err(format!("unknown flag {flag:?}\n{USAGE}")),
        }
    }
    check(&o)?;
    Ok(o)
}

fn seconds(flag: &str, v: &str) -> Result<Duration, String> {
    match v.parse::<u64>() {
        Ok(n) if (1..=3600).contains(&n) => Ok(Duration::from_secs(n)),
        _ => Err(format!("{flag} {v:?}: expected whole seconds, 1 to 3600")),
    }
}

fn check(o: &Opts) -> Result<(), String> {
    if o.node_name.is_empty() {
        return Err(format!("--node-name (or NODE_NAME) is required\n{USAGE}"));
    }
    if !crate::names::is_subdomain(&o.node_name) {
        return Err(format!(
            "--node-name {:?}: not a Kubernetes node name",
            o.node_name
        ));
    }
    if !crate::names::is_taint_key(&o.taint_key) {
        return Err(format!(
            "--taint-key {:?}: not a taint key (an optional DNS prefix and '/', then a name of at most 63 characters)",
            o.taint_key
        ));
    }
    // In a pod these reach the host's systemd as a command line, which expands `$VAR` and
    // `%` specifiers: a path holding either would run something else.
    for (flag, p) in [
        ("--devgate", &o.devgate),
        ("--devgate-config", &o.devgate_config),
    ] {
        let Some(p) = p else { continue };
        if p.as_os_str()
            .as_encoded_bytes()
            .iter()
            .any(|b| *b == b'$' || *b == b'%')
        {
            return Err(format!(
                "{flag} {p:?}: a path with '$' or '%' is refused (the host's systemd would expand it)"
            ));
        }
    }
    // A driver name is a DNS subdomain (the API server's own rule for slice.spec.driver).
    if !crate::names::is_subdomain(&o.gpu_driver) {
        return Err(format!(
            "--gpu-driver {:?}: not a DRA driver name",
            o.gpu_driver
        ));
    }
    if !o.host_root.is_absolute() {
        return Err(format!("--host-root {:?}: must be absolute", o.host_root));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Opts, String> {
        let a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        parse(&a, |_| None)
    }

    #[test]
    fn defaults_and_flags() {
        let o = p(&["--node-name", "n1"]).unwrap();
        assert_eq!(o.effect, Effect::NoSchedule);
        assert_eq!(o.taint_key, "devgate.io/unhealthy");
        assert!(!o.node_taint);
        assert_eq!(o.gpu_driver, "gpu.nvidia.com");
        let o = p(&["--node-name", "n1", "--gpu-driver", "gpu.example.com"]).unwrap();
        assert_eq!(o.gpu_driver, "gpu.example.com");
        assert!(p(&["--node-name", "n1", "--gpu-driver", "Bad/Driver"]).is_err());
        let o = p(&["--node-name", "n1", "--effect", "NoExecute", "--node-taint"]).unwrap();
        assert_eq!(o.effect, Effect::NoExecute);
        assert!(o.node_taint);
        let o = parse(&[], |k| (k == "NODE_NAME").then(|| "from-env".to_string())).unwrap();
        assert_eq!(o.node_name, "from-env");
    }

    #[test]
    fn bad_flags_are_refused_with_a_reason() {
        assert!(p(&[]).unwrap_err().contains("--node-name"));
        assert!(p(&["--node-name", "n", "--effect", "Evict"])
            .unwrap_err()
            .contains("NoExecute"));
        assert!(p(&["--node-name", "n", "--interval", "0"]).is_err());
        assert!(p(&["--node-name", "Bad_Node"]).is_err());
        assert!(p(&["--node-name", "n", "--taint-key", "a/b/c"]).is_err());
        assert!(p(&["--node-name", "n", "--bogus", "x"])
            .unwrap_err()
            .contains("--bogus"));
        assert!(p(&["--node-name"]).unwrap_err().contains("needs a value"));
        let e = p(&["--node-name", "n", "--devgate-config", "/etc/$HOME/c.json"]).unwrap_err();
        assert!(e.contains("systemd would expand"), "{e}");
        assert!(p(&["--node-name", "n", "--devgate", "/usr/bin/devgate%n"]).is_err());
    }
}
