//! The proxy as a service: its own endpoints, sidecar keys, the CLI and shutdown.

use crate::support;

use std::collections::HashMap;
use std::process::Command;

use futures_util::StreamExt;
use support::{client, post_chat, Mock, Proxy};

#[tokio::test]
async fn healthz_and_metrics() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let response = client().get(proxy.url("/healthz")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    // The default store is the embedded file.
    assert_eq!(response.text().await.unwrap(), "ok\ncache: embedded up\n");
    client().get(proxy.url("/v1/models")).send().await.unwrap();
    client()
        .post(proxy.url("/v1/chat/completions"))
        .body("{}")
        .send()
        .await
        .unwrap();
    let response = client().get(proxy.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = response.text().await.unwrap();
    assert!(
        text.contains("\ncompaction_proxy_requests_total 2\n"),
        "{text}"
    );
    assert!(
        text.contains("\ncompaction_proxy_upstream_attempts_total 2\n"),
        "{text}"
    );
    // No tenant has a checkpoint: the store was never asked.
    for line in [
        "compaction_proxy_store_lookups_total{backend=\"embedded\",result=\"hit\"} 0\n",
        "compaction_proxy_store_lookups_total{backend=\"embedded\",result=\"miss\"} 0\n",
        "compaction_proxy_store_errors_total{backend=\"embedded\"} 0\n",
        "compaction_proxy_store_up{backend=\"embedded\"} 1\n",
    ] {
        assert!(text.contains(line), "{line}{text}");
    }
}

/// Starts the proxy from `dir` with no environment at all, as a scratch container does.
fn start_without_environment(
    dir: &std::path::Path,
    binary: &std::path::Path,
    upstream: &str,
) -> Proxy {
    let mut command = Command::new(binary);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--upstream", upstream])
        .current_dir(dir)
        .env_clear();
    Proxy::spawn(&mut command)
}

/// A binary named `compaction-proxy` run in place, with neither `HOME` nor
/// `XDG_STATE_HOME`: there is no state folder, so the checkpoints go to memory, and the
/// operator is told so at start and on `/healthz`. The proxy serves.
#[tokio::test]
async fn with_no_state_folder_the_proxy_starts_with_its_checkpoints_in_memory() {
    let mock = Mock::start().await;
    let dir = support::tempdir();
    let binary = dir.join("compaction-proxy");
    std::fs::copy(env!("CARGO_BIN_EXE_compaction-proxy"), &binary).unwrap();
    let proxy = start_without_environment(&dir, &binary, &mock.url("/v1"));
    let health = client().get(proxy.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let health = health.text().await.unwrap();
    assert!(
        health.starts_with("ok\ncache: memory up\ncache embedded: no state folder"),
        "{health}"
    );
    assert!(
        proxy.logs().contains("set cache.path or XDG_STATE_HOME"),
        "{}",
        proxy.logs()
    );
    let request =
        serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let (status, answer) = post_chat(&proxy, &[], &request).await;
    assert_eq!(status, 200, "{answer}");
    assert!(!dir.join("compaction-proxy").is_dir());
}

/// A default state folder the proxy cannot write (its place is a file) costs the
/// checkpoints their persistence, not the proxy its start; a `cache.path` the operator
/// set that cannot be used still stops it with the path named.
#[tokio::test]
async fn an_unusable_default_store_falls_back_to_memory_and_a_configured_one_stops_the_start() {
    let mock = Mock::start().await;
    let state = support::tempdir();
    std::fs::write(
        state.join("compaction-proxy"),
        "a file where the folder would go",
    )
    .unwrap();
    let state_text = state.to_str().unwrap();
    let env = HashMap::from([("XDG_STATE_HOME", state_text)]);
    let proxy = Proxy::start_with_env(&mock.url("/v1"), "", &env);
    let health = client().get(proxy.url("/healthz")).send().await.unwrap();
    let health = health.text().await.unwrap();
    assert!(
        health.starts_with("ok\ncache: memory up\ncache embedded: the default store "),
        "{health}"
    );

    let config = state.join("proxy.toml");
    let unusable = state.join("compaction-proxy").join("cache.sqlite3");
    std::fs::write(
        &config,
        format!("[cache]\npath = {:?}\n", unusable.to_str().unwrap()),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_compaction-proxy"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &mock.url("/v1"),
            "--config",
        ])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cache.path"),
        "{out:?}"
    );
}

#[tokio::test]
async fn sidecar_mode_injects_the_upstream_key_and_requires_client_keys() {
    let mock = Mock::start().await;
    let env = HashMap::from([
        ("UPSTREAM_KEY", "sk-upstream-secret"),
        ("CLIENT_KEYS", "ck-1, ck-2"),
    ]);
    let config = "[upstream]\napi_key_env = \"UPSTREAM_KEY\"\n[auth]\nkeys_env = \"CLIENT_KEYS\"\n";
    let proxy = Proxy::start_with_env(&mock.url("/v1"), config, &env);

    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer sk-upstream-secret"),
    ] {
        let mut request = client().post(proxy.url("/v1/chat/completions")).body("{}");
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401, "{auth:?}");
        let error: serde_json::Value = response.json().await.unwrap();
        assert_eq!(error["error"]["code"], "invalid_api_key");
    }
    assert!(
        mock.recorded().is_empty(),
        "a rejected request reached the upstream"
    );

    let response = client()
        .get(proxy.url("/v1/models"))
        .header("authorization", "Bearer ck-2")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        mock.last().headers["authorization"],
        "Bearer sk-upstream-secret"
    );
    assert!(!proxy.logs().contains("sk-upstream-secret"));
    assert!(!proxy.logs().contains("ck-2"));
}

#[tokio::test]
async fn sidecar_mode_never_forwards_the_clients_proxy_key() {
    let mock = Mock::start().await;
    let env = HashMap::from([
        ("UPSTREAM_KEY", "sk-upstream-secret"),
        ("CLIENT_KEYS", "ck-1"),
    ]);
    let config = "[upstream]\napi_key_env = \"UPSTREAM_KEY\"\n[auth]\nkeys_env = \"CLIENT_KEYS\"\n";
    let proxy = Proxy::start_with_env(&mock.url("/v1"), config, &env);
    // Whichever header carried the client's key, and any other credential header beside
    // it, stays with the proxy: the upstream sees the injected key alone.
    let presented = [
        vec![("x-api-key", "ck-1")],
        vec![("x-api-key", "ck-1"), ("api-key", "ck-1")],
        vec![("authorization", "Bearer ck-1"), ("x-api-key", "ck-1")],
    ];
    for headers in presented {
        for path in ["/v1/chat/completions", "/v1/embeddings"] {
            let mut request = client().post(proxy.url(path)).body("{}");
            for (name, value) in &headers {
                request = request.header(*name, *value);
            }
            assert_eq!(request.send().await.unwrap().status(), 200, "{headers:?}");
            let seen = mock.last().headers;
            assert_eq!(seen["authorization"], "Bearer sk-upstream-secret");
            assert_eq!(seen.get_all("authorization").iter().count(), 1);
            for name in ["x-api-key", "api-key"] {
                assert!(
                    seen.get(name).is_none(),
                    "{name} reached the upstream via {path}"
                );
            }
        }
    }
}

#[test]
fn refuses_to_be_an_open_relay() {
    let output = Command::new(env!("CARGO_BIN_EXE_compaction-proxy"))
        .args(["check", "--config", "/dev/stdin"])
        .stdin(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert!(output.status.success(), "empty config must be valid");

    let dir = support::tempdir();
    let path = dir.join("p.toml");
    std::fs::write(&path, "[upstream]\napi_key_env = \"K\"\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_compaction-proxy"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("auth"));
}

#[test]
fn check_names_an_unknown_key_and_prints_effective_settings() {
    let dir = support::tempdir();
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[upstream]\nbase_url = \"http://x/v1\"\nidle_timeout = 5\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_compaction-proxy"))
        .args(["check", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty());
    assert!(String::from_utf8_lossy(&output.stderr).contains("idle_timeout"));

    // With no --config, ./proxy.toml is read when it exists.
    std::fs::write(dir.join("proxy.toml"), "listen = \"127.0.0.1:9999\"\n").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_compaction-proxy"))
        .arg("check")
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(output.status.success());
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("listen = \"127.0.0.1:9999\""), "{printed}");
    assert!(
        printed.contains("base_url = \"https://api.openai.com/v1\""),
        "{printed}"
    );
}

#[test]
fn the_example_config_is_valid() {
    let output = Command::new(env!("CARGO_BIN_EXE_compaction-proxy"))
        .args([
            "check",
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/proxy.toml"),
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// One worker thread runs the proxy on a single-threaded runtime, where the large body's
/// parse and count cannot be moved off the runtime (`block_in_place` panics there): it
/// runs in place, and the request and a small one beside it are answered.
#[tokio::test]
async fn one_worker_thread_serves_a_large_body_and_others_beside_it() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(
        &mock.url("/v1"),
        "[server]\nworker_threads = 1\n[[models]]\nmatch = \"*\"\ncontext_window = 2000000\n",
    );
    let large = serde_json::json!({
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "word ".repeat(80_000)}],
    });
    let small =
        serde_json::json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    let (large, small) = tokio::join!(
        post_chat(&proxy, &[], &large),
        post_chat(&proxy, &[], &small)
    );
    assert_eq!((large.0, small.0), (200, 200));
    let sizes: Vec<usize> = mock.recorded().iter().map(|r| r.body.len()).collect();
    assert!(sizes.iter().any(|&n| n > 256 * 1024), "{sizes:?}");
}

#[tokio::test]
async fn sigterm_drains_in_flight_requests_then_exits_zero() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let (mut stream, _) = support::gated_stream(&proxy, "/v1/chat/completions").await;
    // New connections are refused once shutdown has begun.
    proxy.terminate().await;
    mock.state.gate.notify_one();
    let mut rest = Vec::new();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    assert!(String::from_utf8(rest)
        .unwrap()
        .ends_with("data: [DONE]\n\n"));
    let exit = proxy.exited().await;
    assert!(exit.success(), "{exit:?}");
}

/// `compaction_proxy_memory_trims_total` at `proxy`, read over a fresh connection.
async fn memory_trims(proxy: &Proxy) -> Option<u64> {
    let text = support::metrics(proxy).await;
    text.lines()
        .find_map(|line| line.strip_prefix("compaction_proxy_memory_trims_total "))
        .and_then(|count| count.parse().ok())
}

/// Thirty-two chat requests at once, each of 400 KB on its own connection, all closed
/// after: over 4 MB of bodies alive at once, the growth the trimmer waits for.
async fn burst(proxy: &Proxy) {
    let request = serde_json::json!({
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "word ".repeat(80_000)}],
    });
    let answers =
        futures_util::future::join_all((0..32).map(|_| post_chat(proxy, &[], &request))).await;
    assert!(
        answers.iter().all(|(status, _)| *status == 200),
        "{answers:?}"
    );
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[tokio::test]
async fn the_heap_is_trimmed_after_a_burst_and_not_while_idle() {
    let mock = Mock::start().await;
    let config = "[server]\nmemory_trim_interval_ms = 20\n[[models]]\nmatch = \"*\"\ncontext_window = 2000000\n";
    let proxy = Proxy::start(&mock.url("/v1"), config);
    burst(&proxy).await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut polls = 0;
    while memory_trims(&proxy).await.unwrap() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no trim after the bursts"
        );
        polls += 1;
        // glibc may hand a 400 KB body back to the OS itself (mmap) before a tick sees
        // the growth; another burst then grows the heap, as the first usually does.
        if polls % 20 == 0 {
            burst(&proxy).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Idle now: 25 more ticks, and no more trims (the metrics reads' own connections
    // make the load fall, but free nothing worth a trim).
    let settled = memory_trims(&proxy).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(memory_trims(&proxy).await.unwrap(), settled);
}

#[tokio::test]
async fn memory_trim_interval_zero_turns_trimming_off() {
    let mock = Mock::start().await;
    let config = "[server]\nmemory_trim_interval_ms = 0\n[[models]]\nmatch = \"*\"\ncontext_window = 2000000\n";
    let proxy = Proxy::start(&mock.url("/v1"), config);
    burst(&proxy).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(memory_trims(&proxy).await.unwrap(), 0);
}
