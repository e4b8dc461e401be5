//! The API server, through kube's client: raw requests with typed answers, each under a
//! deadline, and the errors the agent tells apart (gone, taken, anything else). Which
//! resource.k8s.io version serves DeviceTaintRules is found by discovery, so the agent
//! speaks 1.36 (v1beta2) and 1.37 (v1) alike.

use http::Request;
use kube::{Client, Config};
use serde::de::DeserializeOwned;
use std::path::Path;
use std::time::Duration;

#[derive(Debug)]
pub enum ApiError {
    /// No answer within the deadline.
    Timeout(String),
    /// The API server answered with an error status.
    Status {
        code: u16,
        what: String,
        message: String,
    },
    /// No connection, bad TLS, an answer that is not the object asked for.
    Other(String),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Timeout(what) => write!(f, "{what}: no answer in time"),
            ApiError::Status {
                code,
                what,
                message,
            } => write!(f, "{what}: {code} {message}"),
            ApiError::Other(e) => write!(f, "{e}"),
        }
    }
}

impl ApiError {
    pub fn code(&self) -> Option<u16> {
        match self {
            ApiError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

pub struct Api {
    client: Client,
    timeout: Duration,
}

/// DRA's group and version on this cluster, when it serves DeviceTaintRules.
pub const DRA_VERSIONS: [&str; 2] = ["v1", "v1beta2"];

impl Api {
    /// A client from `kubeconfig`, else the pod's service account.
    pub async fn connect(kubeconfig: Option<&Path>, timeout: Duration) -> Result<Api, String> {
        let mut config = match kubeconfig {
            Some(p) => {
                let kc = kube::config::Kubeconfig::read_from(p)
                    .map_err(|e| format!("kubeconfig {}: {e}", p.display()))?;
                Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .map_err(|e| format!("kubeconfig {}: {e}", p.display()))?
            }
            None => Config::incluster().map_err(|e| format!("in-cluster config: {e}"))?,
        };
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
        let client = Client::try_from(config).map_err(|e| format!("API client: {e}"))?;
        Ok(Api { client, timeout })
    }

    async fn send(&self, what: &str, req: Request<Vec<u8>>) -> ApiResult<String> {
        match tokio::time::timeout(self.timeout, self.client.request_text(req)).await {
            Err(_) => Err(ApiError::Timeout(what.to_string())),
            Ok(Ok(text)) => Ok(text),
            Ok(Err(kube::Error::Api(s))) => Err(ApiError::Status {
                code: s.code,
                what: what.to_string(),
                message: devgate::model::text::one_line(&s.message),
            }),
            Ok(Err(e)) => Err(ApiError::Other(format!("{what}: {e}"))),
        }
    }

    fn parse<T: DeserializeOwned>(what: &str, text: &str) -> ApiResult<T> {
        serde_json::from_str(text)
            .map_err(|e| ApiError::Other(format!("{what}: unexpected answer: {e}")))
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> ApiResult<T> {
        let req = Request::get(path).body(Vec::new()).expect("request");
        let text = self.send(&format!("GET {path}"), req).await?;
        Self::parse(path, &text)
    }

    /// GET, with 404 as None.
    pub async fn get_opt<T: DeserializeOwned>(&self, path: &str) -> ApiResult<Option<T>> {
        match self.get(path).await {
            Err(e) if e.code() == Some(404) => Ok(None),
            r => r.map(Some),
        }
    }

    pub async fn post(&self, path: &str, body: &serde_json::Value) -> ApiResult<()> {
        let req = Request::post(path)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).expect("json"))
            .expect("request");
        self.send(&format!("POST {path}"), req).await.map(drop)
    }

    /// PATCH with a merge patch (`merge`) or a strategic merge patch.
    pub async fn patch(&self, path: &str, body: &serde_json::Value, merge: bool) -> ApiResult<()> {
        let ct = if merge {
            "application/merge-patch+json"
        } else {
            "application/strategic-merge-patch+json"
        };
        let req = Request::patch(path)
            .header("content-type", ct)
            .body(serde_json::to_vec(body).expect("json"))
            .expect("request");
        self.send(&format!("PATCH {path}"), req).await.map(drop)
    }

    /// DELETE with a uid precondition: only the object the agent looked at goes.
    pub async fn delete(&self, path: &str, uid: &str) -> ApiResult<()> {
        let body = serde_json::json!({"kind": "DeleteOptions", "apiVersion": "v1",
            "preconditions": {"uid": uid}});
        let req = Request::delete(path)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).expect("json"))
            .expect("request");
        match self.send(&format!("DELETE {path}"), req).await {
            Err(e) if e.code() == Some(404) => Ok(()),
            r => r.map(drop),
        }
    }

    /// The resource.k8s.io version that serves DeviceTaintRules and ResourceSlices, or
    /// None where DRA or its device taints are off.
    pub async fn dra_version(&self) -> ApiResult<Option<&'static str>> {
        #[derive(serde::Deserialize)]
        struct Resources {
            #[serde(default)]
            resources: Vec<Resource>,
        }
        #[derive(serde::Deserialize)]
        struct Resource {
            name: String,
        }
        for v in DRA_VERSIONS {
            let path = format!("/apis/resource.k8s.io/{v}");
            if let Some(r) = self.get_opt::<Resources>(&path).await? {
                let has = |n: &str| r.resources.iter().any(|x| x.name == n);
                if has("devicetaintrules") && has("resourceslices") {
                    return Ok(Some(v));
                }
            }
        }
        Ok(None)
    }
}

/// `?labelSelector=` and friends, escaped.
pub fn query(pairs: &[(&str, &str)]) -> String {
    let enc = |s: &str| -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    let q: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", enc(v)))
        .collect();
    format!("?{}", q.join("&"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn queries_are_escaped() {
        assert_eq!(
            super::query(&[(
                "labelSelector",
                "app.kubernetes.io/managed-by=devgate-agent"
            )]),
            "?labelSelector=app.kubernetes.io%2Fmanaged-by%3Ddevgate-agent"
        );
    }
}
