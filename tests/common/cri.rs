//! A CRI (runtime.v1) client for the tests: the k8s-cri crate's typed client over tonic, on
//! the runtime's Unix socket, made blocking with a current-thread tokio runtime. kubelet's
//! calls, with kubelet's messages; every call has a deadline.

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

// Not every test uses every message.
#[allow(unused_imports)]
pub use cri::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatus, Device, ExecSyncResponse,
    KeyValue, LinuxContainerConfig, LinuxContainerResources, Mount, PodSandboxConfig,
};

/// Longer than any call takes here; a call that never answers fails the test instead of
/// hanging it.
const CALL_DEADLINE: Duration = Duration::from_secs(120);

pub struct Cri {
    rt: tokio::runtime::Runtime,
    client: RuntimeServiceClient<Channel>,
}

pub type Status = tonic::Status;

impl Cri {
    pub fn connect(socket: &Path) -> Cri {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let path: PathBuf = socket.to_path_buf();
        let channel = rt
            .block_on(
                // The URI is a placeholder: the connector dials the socket.
                Endpoint::try_from("http://[::]:50051")
                    .unwrap()
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                                tokio::net::UnixStream::connect(path).await?,
                            ))
                        }
                    })),
            )
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", socket.display()));
        Cri {
            rt,
            client: RuntimeServiceClient::new(channel),
        }
    }

    fn call<T>(
        &mut self,
        f: impl std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    ) -> Result<T, Status> {
        self.rt
            .block_on(async { tokio::time::timeout(CALL_DEADLINE, f).await })
            .unwrap_or_else(|_| Err(Status::deadline_exceeded("test deadline")))
            .map(tonic::Response::into_inner)
    }

    pub fn version(&mut self) -> Result<cri::VersionResponse, Status> {
        let mut c = self.client.clone();
        self.call(c.version(cri::VersionRequest {
            version: "v1".into(),
        }))
    }

    pub fn run_pod_sandbox(&mut self, config: &PodSandboxConfig) -> Result<String, Status> {
        let mut c = self.client.clone();
        self.call(c.run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        }))
        .map(|r| r.pod_sandbox_id)
    }

    pub fn stop_pod_sandbox(&mut self, id: &str) -> Result<(), Status> {
        let mut c = self.client.clone();
        self.call(c.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        }))
        .map(drop)
    }

    pub fn remove_pod_sandbox(&mut self, id: &str) -> Result<(), Status> {
        let mut c = self.client.clone();
        self.call(c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        }))
        .map(drop)
    }

    pub fn create_container(
        &mut self,
        sandbox_id: &str,
        config: ContainerConfig,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String, Status> {
        let mut c = self.client.clone();
        self.call(c.create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config.clone()),
        }))
        .map(|r| r.container_id)
    }

    pub fn start_container(&mut self, id: &str) -> Result<(), Status> {
        let mut c = self.client.clone();
        self.call(c.start_container(cri::StartContainerRequest {
            container_id: id.into(),
        }))
        .map(drop)
    }

    pub fn container_status(&mut self, id: &str) -> Result<ContainerStatus, Status> {
        let mut c = self.client.clone();
        self.call(c.container_status(cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        }))
        .map(|r| r.status.unwrap_or_default())
    }

    /// What kubelet's CPU manager sends when it changes a container's CPUs.
    pub fn update_container_resources(
        &mut self,
        id: &str,
        linux: LinuxContainerResources,
    ) -> Result<(), Status> {
        let mut c = self.client.clone();
        self.call(
            c.update_container_resources(cri::UpdateContainerResourcesRequest {
                container_id: id.into(),
                linux: Some(linux),
                ..Default::default()
            }),
        )
        .map(drop)
    }

    /// A command in the container, as kubelet runs exec probes.
    pub fn exec_sync(&mut self, id: &str, cmd: &[&str]) -> Result<ExecSyncResponse, Status> {
        let mut c = self.client.clone();
        self.call(c.exec_sync(cri::ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: 60,
        }))
    }

    pub fn stop_container(&mut self, id: &str) -> Result<(), Status> {
        let mut c = self.client.clone();
        self.call(c.stop_container(cri::StopContainerRequest {
            container_id: id.into(),
            timeout: 0,
        }))
        .map(drop)
    }

    pub fn remove_container(&mut self, id: &str) -> Result<(), Status> {
        let mut c = self.client.clone();
        self.call(c.remove_container(cri::RemoveContainerRequest {
            container_id: id.into(),
        }))
        .map(drop)
    }
}

/// Stops and removes a pod however the test ends, so no sandbox outlives it.
pub struct PodGuard {
    pub socket: PathBuf,
    pub id: String,
}

impl Drop for PodGuard {
    fn drop(&mut self) {
        let mut c = Cri::connect(&self.socket);
        let _ = c.stop_pod_sandbox(&self.id);
        let _ = c.remove_pod_sandbox(&self.id);
    }
}

/// A pod on the node's network (there is no CNI here), as kubelet describes it.
pub fn host_network_pod(
    name: &str,
    uid: &str,
    namespace: &str,
    log_dir: &Path,
) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: uid.into(),
            namespace: namespace.into(),
            attempt: 0,
        }),
        log_directory: log_dir.display().to_string(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A container of `image` running `command`, with `devices` given as kubelet passes a
/// device plugin's allocation (host path = container path, rwm).
pub fn container(name: &str, image: &str, command: &[&str], devices: &[&str]) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        command: command.iter().map(|s| s.to_string()).collect(),
        devices: devices
            .iter()
            .map(|d| Device {
                container_path: d.to_string(),
                host_path: d.to_string(),
                permissions: "rwm".into(),
            })
            .collect(),
        log_path: format!("{name}/0.log"),
        linux: Some(LinuxContainerConfig {
            resources: Some(LinuxContainerResources {
                cpu_shares: 1024,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The containerd config the CRI tests write, by the containerd under test. containerd 2.x
/// still starts from a version 2 config (it migrates it), so with config.toml loaded
/// everywhere the CRI tests passed on 2.x while config-v3.toml, the snippet a 2.x node
/// installs, never started a container in any test. So each version loads its own snippet
/// with its own CRI settings: 2.x split 1.x's `io.containerd.grpc.v1.cri` into
/// `io.containerd.cri.v1.images` (the sandbox image, now `pinned_images.sandbox`, and the
/// snapshotter) and `io.containerd.cri.v1.runtime` (the runtimes, restrict_oom_score_adj),
/// as containerd 2.1's `containerd config default` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Config {
    /// containerd 1.6 and 1.7: config version 2.
    V2,
    /// containerd 2.x: config version 3.
    V3,
}

impl Config {
    /// The config of the containerd on PATH, by its major version (`containerd --version`).
    pub fn of_containerd() -> Config {
        if super::node::containerd_major() >= 2 {
            Config::V3
        } else {
            Config::V2
        }
    }

    /// What goes before any table.
    pub fn top(self) -> &'static str {
        match self {
            Config::V2 => "version = 2",
            Config::V3 => "version = 3",
        }
    }

    /// The shipped snippet under hooks/containerd.
    pub fn snippet(self) -> &'static str {
        match self {
            Config::V2 => "config.toml",
            Config::V3 => "config-v3.toml",
        }
    }

    /// The runtime wrapper's snippet `hooks-config --runtime containerd --wrapper` writes.
    pub fn wrapper_snippet(self) -> &'static str {
        match self {
            Config::V2 => "containerd-runtime-wrapper.toml",
            Config::V3 => "containerd-runtime-wrapper-v3.toml",
        }
    }

    /// The snippet's base_runtime_spec line, as the snippet quotes it.
    pub fn base_spec_line(self) -> &'static str {
        match self {
            Config::V2 => r#"base_runtime_spec = "/etc/containerd/devgate-base-spec.json""#,
            Config::V3 => "base_runtime_spec = '/etc/containerd/devgate-base-spec.json'",
        }
    }

    /// The CRI plugin that holds the runtimes.
    pub fn runtime_plugin(self) -> &'static str {
        match self {
            Config::V2 => "io.containerd.grpc.v1.cri",
            Config::V3 => "io.containerd.cri.v1.runtime",
        }
    }

    /// The runc runtime's table.
    pub fn runc_table(self) -> String {
        format!(
            "[plugins.\"{}\".containerd.runtimes.runc]",
            self.runtime_plugin()
        )
    }

    /// Says in the test's output which snippet the containerd under test loads.
    pub fn say_loaded(self, snippet: &str) {
        eprintln!(
            "containerd {}.x: CRI config from {snippet} ({})",
            super::node::containerd_major(),
            self.top()
        );
    }

    /// The CRI plugin settings a node without a registry needs: the sandbox image is the
    /// imported busybox, and restrict_oom_score_adj because this machine (itself a
    /// container) may not lower oom_score_adj as the sandbox's -998 would.
    pub fn plugin_settings(self, image: &str) -> String {
        match self {
            Config::V2 => format!(
                "[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{image}\"\n  \
                 restrict_oom_score_adj = true\n\n\
                 [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  \
                 default_runtime_name = \"runc\"\n  snapshotter = \"overlayfs\"\n"
            ),
            Config::V3 => format!(
                "[plugins.'io.containerd.cri.v1.images']\n  snapshotter = 'overlayfs'\n\n\
                 [plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = '{image}'\n\n\
                 [plugins.'io.containerd.cri.v1.runtime']\n  restrict_oom_score_adj = true\n\n\
                 [plugins.'io.containerd.cri.v1.runtime'.containerd]\n  \
                 default_runtime_name = 'runc'\n"
            ),
        }
    }
}

/// containerd with the shipped snippet for its version (`Config`), the snippet's base spec
/// path pointed at `base_spec`, and the CRI settings a node without a registry needs.
pub fn containerd_with_snippet(tag: &str, base_spec: &Path) -> super::Containerd {
    let config = Config::of_containerd();
    let name = format!("hooks/containerd/{}", config.snippet());
    let snippet = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(&name))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(snippet.contains(config.base_spec_line()), "{snippet}");
    let (version, tables): (Vec<&str>, Vec<&str>) = snippet
        .lines()
        .partition(|l| l.trim_start().starts_with("version ="));
    assert_eq!(version, [config.top()], "{name}");
    let tables = tables.join("\n").replace(
        "/etc/containerd/devgate-base-spec.json",
        base_spec.to_str().unwrap(),
    );
    config.say_loaded(&name);
    super::Containerd::start(
        tag,
        config.top(),
        &format!("{tables}\n\n{}", config.plugin_settings(super::TEST_IMAGE)),
    )
}

/// Container `id`'s status once it exited, or as it is after 30 s.
pub fn wait_exited(c: &mut Cri, id: &str) -> ContainerStatus {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let st = c.container_status(id).unwrap();
        if st.state == ContainerState::ContainerExited as i32
            || std::time::Instant::now() > deadline
        {
            return st;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
