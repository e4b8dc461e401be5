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
    LinuxContainerConfig, LinuxContainerResources, Mount, PodSandboxConfig,
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

/// The CRI plugin settings (containerd config version 2) a node without a registry needs:
/// the sandbox image is the imported busybox, and restrict_oom_score_adj because this
/// machine (itself a container) may not lower oom_score_adj as the sandbox's -998 would.
pub fn cri_plugin_settings(image: &str) -> String {
    format!(
        "[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{image}\"\n  \
         restrict_oom_score_adj = true\n\n\
         [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"runc\"\n  \
         snapshotter = \"overlayfs\"\n"
    )
}
