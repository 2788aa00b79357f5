use compaction_proxy::engine::{digest::digest, message::Message, Counter};
#[test]
fn scratch() {
    let path = std::env::var("DG_FILE").unwrap();
    let budget: usize = std::env::var("DG_BUDGET")
        .map(|b| b.parse().unwrap())
        .unwrap_or(100_000);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let c = Counter::for_model("gpt-4o");
    let msgs: Vec<Message> = v["messages"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .skip(2)
        .map(|(i, m)| Message::parse(i, m, &c).unwrap())
        .collect();
    let n = msgs.len();
    println!("{}", digest(None, &msgs[..n - 1], budget));
}
