//! The deployment examples (examples/deploy/), the image's default configuration
//! (deploy/rootfs/) and the Dockerfile say what docs/deploy.md says: parsed here, their
//! ports, environment, probes, replicas and Redis asserted, and every configuration they
//! embed accepted by the proxy's own `check`.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_norway::Value;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn yaml_documents(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(repo(path)).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| {
            let mut value = <Value as serde::Deserialize>::deserialize(doc).unwrap();
            value.apply_merge().unwrap(); // compose's `<<: *proxy`
            value
        })
        .collect()
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for key in path {
        cur = cur
            .get(*key)
            .unwrap_or_else(|| panic!("no {key} in {path:?}"));
    }
    cur.as_str()
        .unwrap_or_else(|| panic!("{path:?} is not a string"))
}

/// Runs `compaction-proxy check --config` on `toml`; returns the effective settings.
fn checked(name: &str, toml: &str) -> toml::Table {
    let dir = std::env::temp_dir().join(format!(
        "compaction-proxy-deploy-examples-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, toml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_compaction-proxy"))
        .arg("check")
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "{name}: check refused the configuration: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    toml::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap()
}

fn table<'a>(t: &'a toml::Table, key: &str) -> &'a toml::Table {
    t[key].as_table().unwrap()
}

#[test]
fn compose_runs_two_replicas_sharing_redis() {
    let docs = yaml_documents("examples/deploy/compose.yaml");
    assert_eq!(docs.len(), 1);
    let compose = &docs[0];
    let services = compose["services"].as_mapping().unwrap();
    assert!(services.contains_key("redis"), "no redis service");
    assert!(str_at(compose, &["services", "redis", "image"]).starts_with("redis:"));

    let toml = str_at(compose, &["configs", "proxy_toml", "content"]);
    let settings = checked("compose", toml);
    assert_eq!(settings["listen"].as_str(), Some("0.0.0.0:8080"));
    let cache = table(&settings, "cache");
    assert_eq!(cache["backend"].as_str(), Some("redis"));
    let redis_url = cache["redis_url"].as_str().unwrap();
    assert!(
        redis_url.starts_with("redis://redis:6379"),
        "the replicas reach the redis service by its name: {redis_url}"
    );

    let proxies: Vec<(&str, &Value)> = services
        .iter()
        .filter(|(_, s)| {
            s.get("image")
                .and_then(Value::as_str)
                .is_some_and(|i| i.starts_with("compaction-proxy:"))
        })
        .map(|(name, s)| (name.as_str().unwrap(), s))
        .collect();
    assert_eq!(proxies.len(), 2, "two proxy replicas");
    let mut host_ports = Vec::new();
    for (name, service) in proxies {
        let config = &service["configs"][0];
        assert_eq!(config["source"].as_str(), Some("proxy_toml"), "{name}");
        let target = config["target"].as_str().unwrap();
        let command: Vec<&str> = service["command"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(
            command,
            ["serve", "--config", target],
            "{name} reads the config"
        );
        let depends: Vec<&str> = service["depends_on"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(depends.contains(&"redis"), "{name} depends on redis");
        let ports = service["ports"].as_sequence().unwrap();
        assert_eq!(ports.len(), 1, "{name}");
        let (host, container) = ports[0].as_str().unwrap().split_once(':').unwrap();
        assert_eq!(container, "8080", "{name} publishes the port it listens on");
        host_ports.push(host.to_string());
    }
    host_ports.sort();
    host_ports.dedup();
    assert_eq!(host_ports.len(), 2, "each replica on its own host port");
}

#[test]
fn kubernetes_pod_runs_the_proxy_beside_the_agent() {
    let docs = yaml_documents("examples/deploy/kubernetes.yaml");
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"].as_str() == Some(k))
            .unwrap_or_else(|| panic!("no {k}"))
    };
    let config_map = kind("ConfigMap");
    let pod = kind("Pod");
    let containers = pod["spec"]["containers"].as_sequence().unwrap();
    let container = |name: &str| {
        containers
            .iter()
            .find(|c| c["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no container {name}"))
    };

    let agent = container("agent");
    let env = agent["env"].as_sequence().unwrap();
    let base_url = env
        .iter()
        .find(|e| e["name"].as_str() == Some("OPENAI_BASE_URL"))
        .expect("the agent's OPENAI_BASE_URL");
    assert_eq!(base_url["value"].as_str(), Some("http://127.0.0.1:8080/v1"));

    let proxy = container("compaction-proxy");
    assert!(str_at(proxy, &["image"]).starts_with("compaction-proxy:"));
    assert_eq!(proxy["ports"][0]["containerPort"].as_u64(), Some(8080));
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(
            str_at(proxy, &[probe, "httpGet", "path"]),
            "/healthz",
            "{probe}"
        );
        assert_eq!(
            proxy[probe]["httpGet"]["port"].as_u64(),
            Some(8080),
            "{probe}"
        );
    }

    // The configuration: the ConfigMap, mounted where the proxy's args read it.
    let cm_name = str_at(config_map, &["metadata", "name"]);
    let volumes = pod["spec"]["volumes"].as_sequence().unwrap();
    let config_volume = volumes
        .iter()
        .find(|v| v["configMap"]["name"].as_str() == Some(cm_name))
        .expect("a volume of the ConfigMap");
    let mount = proxy["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["name"] == config_volume["name"])
        .expect("the ConfigMap mounted in the proxy");
    let data = config_map["data"].as_mapping().unwrap();
    assert_eq!(data.len(), 1);
    let (file, toml) = data.iter().next().unwrap();
    let path = format!(
        "{}/{}",
        mount["mountPath"].as_str().unwrap(),
        file.as_str().unwrap()
    );
    let args: Vec<&str> = proxy["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(args, ["serve", "--config", path.as_str()]);

    let settings = checked("kubernetes", toml.as_str().unwrap());
    assert_eq!(
        settings["listen"].as_str(),
        Some("0.0.0.0:8080"),
        "the kubelet's probes come from outside the pod's loopback"
    );
    let cache = table(&settings, "cache");
    let store = cache["path"].as_str().unwrap();
    let state_mount = proxy["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| store.starts_with(&format!("{}/", m["mountPath"].as_str().unwrap())))
        .expect("the embedded store on a mounted volume");
    let state_volume = volumes
        .iter()
        .find(|v| v["name"] == state_mount["name"])
        .unwrap();
    assert!(
        state_volume.get("emptyDir").is_some(),
        "the store in an emptyDir"
    );
}

#[test]
fn the_image_configuration_listens_on_8080_and_keeps_its_store_in_the_volume() {
    let toml =
        std::fs::read_to_string(repo("deploy/rootfs/etc/compaction-proxy/proxy.toml")).unwrap();
    let settings = checked("image", &toml);
    assert_eq!(settings["listen"].as_str(), Some("0.0.0.0:8080"));
    let cache = table(&settings, "cache");
    assert_eq!(cache["backend"].as_str(), Some("embedded"));
    assert_eq!(
        cache["path"].as_str(),
        Some("/var/lib/compaction-proxy/cache.sqlite3")
    );
    let passwd = std::fs::read_to_string(repo("deploy/rootfs/etc/passwd")).unwrap();
    assert!(passwd.contains(":65532:65532:"), "{passwd}");
    let group = std::fs::read_to_string(repo("deploy/rootfs/etc/group")).unwrap();
    assert!(group.contains(":65532:"), "{group}");
}

/// The Dockerfile builds what scripts/release.sh and scripts/oci-image.py build.
#[test]
fn dockerfile_matches_the_release_script() {
    let dockerfile = std::fs::read_to_string(repo("Dockerfile")).unwrap();
    let image_script = std::fs::read_to_string(repo("scripts/oci-image.py")).unwrap();
    let release = std::fs::read_to_string(repo("scripts/release.sh")).unwrap();
    for flag in ["-C target-feature=+crt-static", "x86_64-unknown-linux-gnu"] {
        assert!(dockerfile.contains(flag), "Dockerfile: {flag}");
        assert!(release.contains(flag), "release.sh: {flag}");
    }
    assert!(release.contains("profile=ship"));
    assert!(dockerfile.contains("--profile ship"));
    for line in [
        "FROM scratch",
        "COPY deploy/rootfs/ /",
        "USER 65532:65532",
        "EXPOSE 8080",
        "VOLUME [\"/var/lib/compaction-proxy\"]",
        "WORKDIR /etc/compaction-proxy",
        "ENTRYPOINT [\"/usr/local/bin/compaction-proxy\"]",
        "CMD [\"serve\", \"--config\", \"/etc/compaction-proxy/proxy.toml\"]",
        "ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
        "ENV XDG_STATE_HOME=/var/lib",
        "ENV MALLOC_ARENA_MAX=2",
    ] {
        assert!(
            dockerfile.lines().any(|l| l.trim() == line),
            "Dockerfile: {line}"
        );
    }
    for item in [
        "\"User\": f\"{USER}:{USER}\"",
        "USER = 65532",
        "\"8080/tcp\"",
        "STATE = \"var/lib/compaction-proxy\"",
        "BINARY = \"usr/local/bin/compaction-proxy\"",
        "CONFIG = \"/etc/compaction-proxy/proxy.toml\"",
        "\"Cmd\": [\"serve\", \"--config\", CONFIG]",
        "\"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt\"",
        "\"XDG_STATE_HOME=/var/lib\"",
        "\"MALLOC_ARENA_MAX=2\"",
        "\"WorkingDir\": os.path.dirname(CONFIG)",
    ] {
        assert!(image_script.contains(item), "oci-image.py: {item}");
    }
}
