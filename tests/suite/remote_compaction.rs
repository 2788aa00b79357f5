//! Codex asks for compaction itself: a Responses request ending in `compaction_trigger`
//! (Codex 0.169's only way), or `POST /responses/compact` (earlier versions). Behind the
//! proxy, an upstream that lacks them (the mock, as vLLM or llama.cpp would) still gives
//! Codex the one `compaction` item it needs, written by the proxy's summariser; the item
//! comes back in later requests and reaches the upstream as the summary's text. An
//! upstream that implements them (OpenAI) answers them itself, untouched.

// Test code: a failed step should stop the test where it failed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use compaction_proxy::dialect::codex_items::ITEM_PREFIX;
use compaction_proxy::engine::MARKER;
use serde_json::{json, Value};
use support::{metrics, post_json, Mock, Proxy, CANNED_SUMMARY, NATIVE_COMPACTION};

const MODEL: &str = "gpt-5";

fn user(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

/// A Codex history: its instructions as a developer message, two user turns, a tool call.
fn history() -> Vec<Value> {
    vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]}),
        user("turn one: make the build pass; never touch config/prod.yaml"),
        json!({"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"cmd\":\"cargo build\"}"}),
        json!({"type": "function_call_output", "call_id": "c1", "output": "error[E0432]: unresolved import `crate::db`"}),
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Fixed the import in src/main.rs."}]}),
        user("turn two: now run the tests"),
    ]
}

fn trigger_request(stream: bool) -> Value {
    let mut input = history();
    input.push(json!({"type": "compaction_trigger"}));
    json!({"model": MODEL, "input": input, "stream": stream, "store": false,
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]})
}

struct Answer {
    status: u16,
    x: String,
    body: String,
}

async fn post(proxy: &Proxy, path: &str, body: &Value, native: bool) -> Answer {
    let headers = [
        ("x-mock", "window"),
        ("x-mock-window", "100000"),
        ("x-mock-compaction", if native { "native" } else { "" }),
    ];
    let (status, x, body) = post_json(proxy, path, &headers, body).await;
    Answer { status, x, body }
}

/// The data of each server-sent event.
fn events(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// The one compaction item of a streamed answer, as Codex reads it: from the
/// `response.output_item.done` events, which must hold exactly one, before a
/// `response.completed` carrying the response's id.
fn streamed_item(body: &str) -> Value {
    let events = events(body);
    let done: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .collect();
    assert_eq!(done.len(), 1, "{body}");
    let completed = events.last().unwrap();
    assert_eq!(completed["type"], "response.completed");
    assert!(completed["response"]["id"].as_str().is_some());
    done[0]["item"].clone()
}

/// The compaction item of a first streamed compaction through `proxy`.
async fn first_item(proxy: &Proxy) -> Value {
    let answer = post(proxy, "/v1/responses", &trigger_request(true), false).await;
    streamed_item(&answer.body)
}

#[tokio::test]
async fn a_compaction_trigger_is_answered_with_one_item_holding_the_summary() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let answer = post(&proxy, "/v1/responses", &trigger_request(true), false).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        answer.x.starts_with("applied; trigger=client; attempts=1;"),
        "{}",
        answer.x
    );
    assert!(answer.x.contains("summary=llm"), "{}", answer.x);
    let item = streamed_item(&answer.body);
    assert_eq!(item["type"], "compaction");
    assert!(item["id"].as_str().unwrap().starts_with("cmp_"));
    let content = item["encrypted_content"].as_str().unwrap();
    assert_eq!(content, format!("{ITEM_PREFIX}{CANNED_SUMMARY}"));
    // The summariser was asked in the client's dialect, through the upstream.
    let summaries = mock.summaries();
    assert_eq!(summaries.len(), 1);
    assert!(summaries[0].uri.ends_with("/v1/responses"));
    let asked: Value = serde_json::from_slice(&summaries[0].body).unwrap();
    assert!(asked["input"].to_string().contains("config/prod.yaml"));

    // The upstream said it does not know the item: it is not asked again.
    let upstream_calls = mock.recorded().len();
    let again = post(&proxy, "/v1/responses", &trigger_request(false), false).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(mock.recorded().len(), upstream_calls);
    assert!(again.x.starts_with("applied; trigger=client; attempts=0;"));
    let response: Value = serde_json::from_str(&again.body).unwrap();
    assert_eq!(response["object"], "response");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["output"].as_array().unwrap().len(), 1);
    assert_eq!(response["output"][0]["type"], "compaction");

    let metrics = metrics(&proxy).await;
    assert!(metrics.contains("compaction_proxy_compactions_total{trigger=\"client\"} 2"));
    assert!(metrics.contains("compaction_proxy_compactions_by_api_total{api=\"responses\"} 2"));
}

#[tokio::test]
async fn the_proxys_item_reaches_the_upstream_as_the_summarys_text() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let item = first_item(&proxy).await;
    // The next turn as Codex sends it: the kept user messages, the item, the new message.
    let next = json!({"model": MODEL, "stream": false, "input": [
        user("turn one: make the build pass; never touch config/prod.yaml"),
        user("turn two: now run the tests"),
        item,
        user("turn three: commit"),
    ]});
    let answer = post(&proxy, "/v1/responses", &next, false).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let sent: Value = serde_json::from_slice(&mock.last().body).unwrap();
    let input = sent["input"].as_array().unwrap();
    assert_eq!(input.len(), 4);
    assert!(input.iter().all(|i| i["type"] != "compaction"));
    let summary = input[2]["content"][0]["text"].as_str().unwrap();
    assert!(summary.starts_with(MARKER) && summary.contains(CANNED_SUMMARY));
    // Between two user messages the summary speaks as the assistant: roles alternate.
    assert_eq!(input[2]["role"], "assistant");
    assert_eq!(input[3], user("turn three: commit"));
}

#[tokio::test]
async fn a_second_compaction_carries_the_first_summary_forward() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let item = first_item(&proxy).await;
    let request = json!({"model": MODEL, "stream": true, "input": [
        user("turn two: now run the tests"),
        item,
        user("turn three: commit"),
        {"type": "compaction_trigger"},
    ]});
    let answer = post(&proxy, "/v1/responses", &request, false).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    streamed_item(&answer.body);
    let asked: Value = serde_json::from_slice(&mock.summaries().last().unwrap().body).unwrap();
    let asked = asked["input"].to_string();
    assert!(
        asked.contains("MOCK-CHECKPOINT"),
        "the previous summary was not carried"
    );
    assert!(asked.contains("turn three: commit"));
}

#[tokio::test]
async fn the_compact_endpoint_is_answered_with_the_users_messages_then_the_item() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let request = json!({"model": MODEL, "input": history(), "instructions": "You are Codex."});
    let answer = post(&proxy, "/v1/responses/compact", &request, false).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        answer.x.starts_with("applied; trigger=client;"),
        "{}",
        answer.x
    );
    let object: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(object["object"], "response.compaction");
    let output = object["output"].as_array().unwrap();
    assert_eq!(output.len(), 3);
    assert_eq!(output[0], history()[1]);
    assert_eq!(output[1], history()[5]);
    assert_eq!(output[2]["type"], "compaction");
    assert_eq!(
        output[2]["encrypted_content"],
        format!("{ITEM_PREFIX}{CANNED_SUMMARY}")
    );
    // The summary was asked of the Responses endpoint beside it.
    assert!(mock.summaries()[0].uri.ends_with("/v1/responses"));
}

#[tokio::test]
async fn an_upstream_that_compacts_answers_for_itself() {
    let mock = Mock::start().await;
    let proxy = Proxy::start(&mock.url("/v1"), "");
    let request = json!({"model": MODEL, "input": history()});
    let answer = post(&proxy, "/v1/responses/compact", &request, true).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.x, "");
    let object: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(object["output"][0]["encrypted_content"], NATIVE_COMPACTION);
    let answer = post(&proxy, "/v1/responses", &trigger_request(false), true).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.x, "");
    let response: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(
        response["output"][0]["encrypted_content"],
        NATIVE_COMPACTION
    );
    assert!(mock.summaries().is_empty());
    // Its own items pass through in later requests, untouched.
    let next = json!({"model": MODEL, "input": [response["output"][0].clone(), user("go on")]});
    assert_eq!(post(&proxy, "/v1/responses", &next, true).await.status, 200);
    assert_eq!(mock.last().body, serde_json::to_vec(&next).unwrap());
}

#[tokio::test]
async fn configured_to_answer_itself_the_proxy_never_asks_the_upstream() {
    let mock = Mock::start().await;
    let config = "[compaction]\nremote_compaction = \"proxy\"\n";
    let proxy = Proxy::start(&mock.url("/v1"), config);
    let answer = post(&proxy, "/v1/responses", &trigger_request(true), true).await;
    assert_eq!(answer.status, 200);
    assert!(answer.x.starts_with("applied; trigger=client; attempts=0;"));
    streamed_item(&answer.body);
    assert!(mock.recorded().is_empty());
}

#[tokio::test]
async fn without_a_summariser_the_digest_is_the_summary_and_says_so() {
    let mock = Mock::start().await;
    let config = "[summarizer]\nenabled = false\n";
    let proxy = Proxy::start(&mock.url("/v1"), config);
    let answer = post(&proxy, "/v1/responses", &trigger_request(true), false).await;
    assert_eq!(answer.status, 200);
    assert!(answer.x.contains("summary=fallback"), "{}", answer.x);
    let item = streamed_item(&answer.body);
    let content = item["encrypted_content"].as_str().unwrap();
    assert!(content.starts_with(ITEM_PREFIX));
    assert!(content.contains("config/prod.yaml"), "{content}");
    assert!(metrics(&proxy)
        .await
        .contains("compaction_proxy_summaries_total{source=\"fallback\"} 1"));
}

#[tokio::test]
async fn a_history_that_is_only_an_earlier_summary_gets_it_back_as_it_was() {
    let mock = Mock::start().await;
    let config = "[summarizer]\nenabled = false\n";
    let proxy = Proxy::start(&mock.url("/v1"), config);
    let item = first_item(&proxy).await;
    let request = json!({"model": MODEL, "stream": true, "input": [
        item.clone(),
        {"type": "compaction_trigger"},
    ]});
    let answer = post(&proxy, "/v1/responses", &request, false).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    // Digested again it would read differently, and the upstream's cache would miss.
    assert!(answer.x.contains("summary=cache"), "{}", answer.x);
    let again = streamed_item(&answer.body);
    assert_eq!(again["encrypted_content"], item["encrypted_content"]);
}
