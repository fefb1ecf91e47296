//! A Pod's volumes as the kubelet makes them: Secret and ConfigMap volumes and projected volumes (the one the
//! ServiceAccount admission plugin adds, `kube-api-access-*`: the ServiceAccount token bound to
//! the Pod, the `kube-root-ca.crt` ConfigMap's `ca.crt` and the namespace from the downward
//! API), each a directory of the lab written by the kubelet's atomic writer
//! ([`Volume::write`]), which the container sees at its `mountPath` through a bind mount in its
//! own mount namespace. Other kinds of volume are refused with the reason.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::spec::{Lookup, field_ref, secret_data, text};

/// A key of a Secret or ConfigMap as a file (`items`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// The key.
    pub key: String,
    /// The file's path in the volume.
    pub path: String,
    /// Its mode (the volume's `defaultMode` when unset).
    pub mode: Option<u32>,
}

/// One source of a volume's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Projection {
    /// A token of the Pod's ServiceAccount, bound to the Pod (TokenRequest).
    Token {
        /// The file's path.
        path: String,
        /// `expirationSeconds` (3607 when unset, as the admission plugin writes it).
        expiration_seconds: u64,
        /// `audience` (the API server's own when unset).
        audience: Option<String>,
    },
    /// The keys of a Secret (`resource` `secrets`) or ConfigMap (`configmaps`).
    Object {
        /// `secrets` or `configmaps`.
        resource: &'static str,
        /// The object's name.
        name: String,
        /// `optional`: the volume is made without it.
        optional: bool,
        /// `items`, or every key under its own name.
        items: Option<Vec<Item>>,
    },
    /// Downward API fields: (path, `fieldPath`, mode).
    Fields(Vec<(String, String, Option<u32>)>),
}

/// A file of a volume: its path, its bytes, its mode.
pub type File = (String, Vec<u8>, u32);

/// A volume mounted by a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    /// The volume's name.
    pub name: String,
    /// Where its files come from.
    pub sources: Vec<Projection>,
    /// `defaultMode` (0644 when unset).
    pub default_mode: u32,
    /// Where the container sees it.
    pub mount_path: String,
    /// `readOnly` of the mount.
    pub read_only: bool,
    /// The lab's directory holding it.
    pub dir: PathBuf,
}

fn items(list: &Value) -> Option<Vec<Item>> {
    list.as_array().map(|items| {
        items
            .iter()
            .map(|i| Item {
                key: text(i, "/key").unwrap_or("").to_string(),
                path: text(i, "/path").unwrap_or("").to_string(),
                mode: i["mode"].as_u64().map(|m| m as u32),
            })
            .collect()
    })
}

fn mode(v: &Value) -> u32 {
    v["defaultMode"].as_u64().unwrap_or(0o644) as u32
}

/// The sources of one projected volume's `sources` entry.
fn projection(source: &Value, volume: &str) -> Result<Projection> {
    let object = |resource: &'static str, o: &Value| -> Result<Projection> {
        Ok(Projection::Object {
            resource,
            name: text(o, "/name")
                .with_context(|| format!("volume {volume}: a projected {resource} without a name"))?
                .to_string(),
            optional: o["optional"].as_bool().unwrap_or(false),
            items: items(&o["items"]),
        })
    };
    if let Some(token) = source.get("serviceAccountToken") {
        return Ok(Projection::Token {
            path: text(token, "/path").unwrap_or("token").to_string(),
            expiration_seconds: token["expirationSeconds"].as_u64().unwrap_or(3607),
            audience: text(token, "/audience").map(str::to_string),
        });
    }
    if let Some(o) = source.get("configMap") {
        return object("configmaps", o);
    }
    if let Some(o) = source.get("secret") {
        return object("secrets", o);
    }
    if let Some(d) = source.get("downwardAPI") {
        let mut fields = Vec::new();
        for i in d["items"].as_array().into_iter().flatten() {
            let path = text(i, "/path").unwrap_or("").to_string();
            let Some(field) = text(i, "/fieldRef/fieldPath") else {
                bail!("volume {volume}: downwardAPI {path}: only fieldRef is played by the lab");
            };
            fields.push((
                path,
                field.to_string(),
                i["mode"].as_u64().map(|m| m as u32),
            ));
        }
        return Ok(Projection::Fields(fields));
    }
    bail!("volume {volume}: projected source {source}: not played by the lab")
}

/// The volumes `container` mounts, each in a directory under `pod_dir` laid out as the
/// kubelet's (`volumes/kubernetes.io~<kind>/<name>`).
pub fn volumes(pod_spec: &Value, container: &Value, pod_dir: &Path) -> Result<Vec<Volume>> {
    let declared = pod_spec["volumes"].as_array().cloned().unwrap_or_default();
    let mut out = Vec::new();
    for mount in container["volumeMounts"].as_array().into_iter().flatten() {
        let name = text(mount, "/name").context("a volumeMount without a name")?;
        let mount_path = text(mount, "/mountPath")
            .with_context(|| format!("volumeMount {name}: no mountPath"))?;
        if mount.get("subPath").is_some() {
            bail!("volumeMount {name}: subPath is not played by the lab");
        }
        let volume = declared
            .iter()
            .find(|v| v["name"] == name)
            .with_context(|| format!("volumeMount {name}: no such volume"))?;
        let (kind, sources, default_mode) = if let Some(secret) = volume.get("secret") {
            let source = Projection::Object {
                resource: "secrets",
                name: text(secret, "/secretName")
                    .with_context(|| format!("volume {name}: no secretName"))?
                    .to_string(),
                optional: secret["optional"].as_bool().unwrap_or(false),
                items: items(&secret["items"]),
            };
            ("secret", vec![source], mode(secret))
        } else if let Some(config_map) = volume.get("configMap") {
            let source = Projection::Object {
                resource: "configmaps",
                name: text(config_map, "/name")
                    .with_context(|| format!("volume {name}: a configMap without a name"))?
                    .to_string(),
                optional: config_map["optional"].as_bool().unwrap_or(false),
                items: items(&config_map["items"]),
            };
            ("configmap", vec![source], mode(config_map))
        } else if let Some(projected) = volume.get("projected") {
            let sources = projected["sources"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| projection(s, name))
                .collect::<Result<Vec<_>>>()?;
            ("projected", sources, mode(projected))
        } else {
            bail!(
                "volume {name}: only Secret, ConfigMap and projected volumes are played by the lab"
            );
        };
        out.push(Volume {
            name: name.to_string(),
            sources,
            default_mode,
            mount_path: mount_path.to_string(),
            read_only: mount["readOnly"].as_bool().unwrap_or(false),
            dir: pod_dir
                .join(format!("volumes/kubernetes.io~{kind}"))
                .join(name),
        });
    }
    Ok(out)
}

/// The data of a ConfigMap (`data` and `binaryData`).
fn config_map_data(object: &Value) -> Result<BTreeMap<String, Vec<u8>>> {
    let typed: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(object.clone()).context("decoding a ConfigMap")?;
    let mut data: BTreeMap<String, Vec<u8>> = typed
        .binary_data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    for (k, v) in typed.data.unwrap_or_default() {
        data.insert(k, v.into_bytes());
    }
    Ok(data)
}

impl Volume {
    /// The files the volume holds now, `None` while an object it needs (not optional) is
    /// missing. `lookup` finds Secrets and ConfigMaps; `token(audience, expirationSeconds)` is
    /// the Pod's ServiceAccount token.
    pub fn files(
        &self,
        pod: &Value,
        lookup: Lookup<'_>,
        token: &dyn Fn(Option<&str>, u64) -> Result<String>,
    ) -> Result<Option<Vec<File>>> {
        let namespace = text(pod, "/metadata/namespace").unwrap_or("default");
        let mut files = Vec::new();
        for source in &self.sources {
            match source {
                Projection::Token {
                    path,
                    expiration_seconds,
                    audience,
                } => {
                    let token = token(audience.as_deref(), *expiration_seconds)?;
                    files.push((path.clone(), token.into_bytes(), self.default_mode));
                }
                Projection::Fields(fields) => {
                    for (path, field, mode) in fields {
                        let value = field_ref(pod, field)?;
                        files.push((
                            path.clone(),
                            value.into_bytes(),
                            mode.unwrap_or(self.default_mode),
                        ));
                    }
                }
                Projection::Object {
                    resource,
                    name,
                    optional,
                    items,
                } => {
                    let Some(object) = lookup(resource, namespace, name) else {
                        if *optional {
                            continue;
                        }
                        return Ok(None);
                    };
                    let data = if *resource == "secrets" {
                        secret_data(&object)?
                    } else {
                        config_map_data(&object)?
                    };
                    files.extend(self.keys(&data, items.as_deref(), *optional, name)?);
                }
            }
        }
        Ok(Some(files))
    }

    /// The files of `data` that `items` names (every key when `None`).
    fn keys(
        &self,
        data: &BTreeMap<String, Vec<u8>>,
        items: Option<&[Item]>,
        optional: bool,
        object: &str,
    ) -> Result<Vec<File>> {
        let Some(items) = items else {
            return Ok(data
                .iter()
                .map(|(k, v)| (k.clone(), v.clone(), self.default_mode))
                .collect());
        };
        let mut files = Vec::new();
        for item in items {
            match data.get(&item.key) {
                Some(v) => files.push((
                    item.path.clone(),
                    v.clone(),
                    item.mode.unwrap_or(self.default_mode),
                )),
                None if optional => {}
                None => bail!("volume {}: {object} has no key {}", self.name, item.key),
            }
        }
        Ok(files)
    }

    /// Writes `files` as the kubelet's atomic writer does: a fresh directory `..<serial>`, the
    /// symlink `..data` swapped to it by a rename, one symlink per file into `..data`, the old
    /// directory removed.
    pub fn write(&self, files: &[File], serial: &str) -> Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = &self.dir;
        std::fs::create_dir_all(dir)?;
        let fresh = format!("..{serial}");
        let target = dir.join(&fresh);
        let _ = std::fs::remove_dir_all(&target);
        std::fs::create_dir_all(&target)?;
        for (path, bytes, mode) in files {
            if path.is_empty() || path.contains("..") || path.starts_with('/') {
                bail!("volume {}: item path {path:?} is not relative", self.name);
            }
            let file = target.join(path);
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&file, bytes)?;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(*mode))?;
        }
        let old = std::fs::read_link(dir.join("..data")).ok();
        let staged = dir.join("..data_tmp");
        let _ = std::fs::remove_file(&staged);
        std::os::unix::fs::symlink(&fresh, &staged)?;
        std::fs::rename(&staged, dir.join("..data"))?;
        for (path, _, _) in files {
            let top = path.split('/').next().unwrap_or(path);
            let link = dir.join(top);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(Path::new("..data").join(top), &link)?;
            }
        }
        if let Some(old) = old.filter(|o| *o != Path::new(&fresh)) {
            let _ = std::fs::remove_dir_all(dir.join(old));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_secret_volume_is_written_atomically_with_its_items_and_modes() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("swimlb-kubelet-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let spec = json!({"volumes": [{"name": "key", "secret": {"secretName": "s",
            "optional": true, "defaultMode": 256, "items": [{"key": "keys", "path": "keys"}]}}]});
        let container = json!({"volumeMounts": [{"name": "key", "mountPath": "/etc/k"}]});
        let volumes = volumes(&spec, &container, &dir).unwrap();
        assert_eq!(volumes.len(), 1);
        let volume = &volumes[0];
        let secret = |keys: &str| {
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                "data": {"keys": keys, "other": "eA=="}})
        };
        let no_token = |_: Option<&str>, _: u64| -> Result<String> { bail!("no token here") };
        let pod = json!({"metadata": {"namespace": "ns"}});
        let with = |keys: &'static str| {
            move |_: &str, _: &str, _: &str| -> Option<Value> { Some(secret(keys)) }
        };
        let none = |_: &str, _: &str, _: &str| -> Option<Value> { None };
        // Optional: made empty while the Secret is missing.
        assert_eq!(volume.files(&pod, &none, &no_token).unwrap(), Some(vec![]));
        let files = volume
            .files(&pod, &with("b25l"), &no_token)
            .unwrap()
            .unwrap();
        assert_eq!(files, [("keys".to_string(), b"one".to_vec(), 0o400)]);
        volume.write(&files, "1").unwrap();
        let path = volume.dir.join("keys");
        assert_eq!(std::fs::read(&path).unwrap(), b"one");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o400);
        let files = volume
            .files(&pod, &with("dHdv"), &no_token)
            .unwrap()
            .unwrap();
        volume.write(&files, "2").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert!(!volume.dir.join("..1").exists(), "the old data is removed");
        let other = json!({"volumes": [{"name": "key", "emptyDir": {}}]});
        assert!(super::volumes(&other, &container, &dir).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_service_account_volume_holds_the_token_the_ca_and_the_namespace() {
        // As the ServiceAccount admission plugin writes it into every Pod.
        let spec = json!({"volumes": [{"name": "kube-api-access-x2x4z", "projected": {
            "defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}]});
        let container = json!({"volumeMounts": [{"name": "kube-api-access-x2x4z", "readOnly": true,
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]});
        let volumes = volumes(&spec, &container, Path::new("/p")).unwrap();
        let volume = &volumes[0];
        assert!(volume.read_only);
        assert_eq!(
            volume.dir,
            Path::new("/p/volumes/kubernetes.io~projected/kube-api-access-x2x4z")
        );
        let pod = json!({"metadata": {"namespace": "swimlb-system"}});
        let lookup = |resource: &str, namespace: &str, name: &str| -> Option<Value> {
            assert_eq!(
                (resource, namespace, name),
                ("configmaps", "swimlb-system", "kube-root-ca.crt")
            );
            Some(json!({"data": {"ca.crt": "PEM"}}))
        };
        let token = |audience: Option<&str>, seconds: u64| -> Result<String> {
            assert_eq!((audience, seconds), (None, 3607));
            Ok("jwt".to_string())
        };
        let files = volume.files(&pod, &lookup, &token).unwrap().unwrap();
        assert_eq!(
            files,
            [
                ("token".to_string(), b"jwt".to_vec(), 0o644),
                ("ca.crt".to_string(), b"PEM".to_vec(), 0o644),
                ("namespace".to_string(), b"swimlb-system".to_vec(), 0o644),
            ]
        );
        // A required ConfigMap that is missing holds the container back.
        let none = |_: &str, _: &str, _: &str| -> Option<Value> { None };
        assert_eq!(volume.files(&pod, &none, &token).unwrap(), None);
    }
}
