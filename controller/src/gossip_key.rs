//! The speakers' gossip key Secret: created by the leader when there is none, so one
//! `kubectl apply` of the manifests is enough (MetalLB's users create theirs by hand).
//!
//! The leader never reads the Secret: it creates it with one new random key in the key file
//! format (`swimlb-speaker keygen`), and the API server's AlreadyExists answer (409) means it is
//! there, left as it was: rotation is the operator's (docs/src/install/upgrade.md). So the
//! controller needs `create` on Secrets and nothing that reads one. Failures are retried with
//! backoff in the background and never hold allocation up.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

/// The key of the Secret's data that holds the key file (the speaker mounts it as a file).
pub const DATA_KEY: &str = "keys";

/// What [`ensure`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The Secret was there already (the API server answered AlreadyExists; left as it was).
    Exists,
    /// This call created it.
    Created,
}

/// Why the Secret could not be ensured (the caller retries).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API refused or could not be reached.
    #[error("Secret {namespace}/{name}: {source}")]
    Api {
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
        /// The API's error.
        source: kube::Error,
    },
    /// No randomness for a key.
    #[error("no system randomness for a gossip key: {0}")]
    Random(std::io::Error),
}

/// Makes sure Secret `namespace/name` exists: creates it with a new key, and takes the API
/// server's AlreadyExists (409) for "it exists" (never reading it, never changing it).
pub async fn ensure(client: Client, namespace: &str, name: &str) -> Result<Outcome, Error> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let api_error = |source| Error::Api {
        namespace: namespace.to_string(),
        name: name.to_string(),
        source,
    };
    let keys = swimlb_config::keyfile::new_key_file().map_err(Error::Random)?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/name".to_string(),
                "swimlb".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            DATA_KEY.to_string(),
            ByteString(keys.into_bytes()),
        )])),
        ..Secret::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(Outcome::Created),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Outcome::Exists),
        Err(e) => Err(api_error(e)),
    }
}

/// [`ensure`], retried with a doubling backoff (1 s to 60 s) until it succeeds; logs the
/// outcome and counts each failure. Meant to run in its own task.
pub async fn ensure_with_retries(
    client: Client,
    namespace: String,
    name: String,
    metrics: crate::metrics::ControllerMetrics,
) {
    let mut backoff = Duration::from_secs(1);
    loop {
        match ensure(client.clone(), &namespace, &name).await {
            Ok(Outcome::Created) => {
                tracing::info!(%namespace, %name, "created the speakers' gossip key Secret");
                return;
            }
            Ok(Outcome::Exists) => return,
            Err(e) => {
                metrics.write_error(crate::metrics::ApiResource::Secrets);
                tracing::warn!(error = %e, "gossip key Secret not ensured; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(60));
            }
        }
    }
}
