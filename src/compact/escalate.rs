//! Pass 8: when head + summary + tail is still over the target, give up more in a fixed
//! sequence of steps, each tried once: a smaller tail, pruned tail tool traffic, truncated
//! oversized messages, and finally instructions + summary + latest user message alone.
//! The smallest candidate wins if none fits.

use serde_json::Value;

use super::boundary;
use super::merge::last_user;
use super::message::{keep_ends, Message};
use super::prune;
use super::summary::{digest, wrap};
use super::{build, chars_for, Options, Plan};

struct Best {
    messages: Vec<Message>,
    tokens: usize,
    notes: Vec<String>,
}

impl Best {
    /// Keeps `candidate` if it is smaller; says whether it fits.
    fn offer(&mut self, plan: &Plan, candidate: Vec<Message>, notes: &[String]) -> bool {
        let tokens = plan.total(&candidate);
        if tokens < self.tokens {
            self.messages = candidate;
            self.tokens = tokens;
            self.notes = notes.to_vec();
        }
        tokens <= plan.target
    }
}

/// Returns the assembled messages and notes on the steps taken.
pub fn build_fitting(plan: &Plan, body: &str, opts: &Options) -> (Vec<Message>, Vec<String>) {
    let msgs = &plan.messages;
    let counter = &plan.counter;
    let mut notes = Vec::new();
    let first = build(
        plan,
        &msgs[..plan.head_end],
        &plan.kept_instructions,
        body,
        &msgs[plan.tail_start..],
        &mut notes,
    );
    let mut best = Best {
        tokens: plan.total(&first),
        messages: first,
        notes: notes.clone(),
    };
    if best.tokens <= plan.target {
        return (best.messages, best.notes);
    }
    let budget_chars = chars_for(opts.summary_budget(plan.target));

    // 1. No protected first turns, a quarter of the tail budget, one message minimum.
    let head_end = boundary::head_end(msgs, 0);
    let tail_start = boundary::tail_start(msgs, head_end, opts.tail_budget(plan.target) / 4, 1)
        .max(plan.tail_start);
    // Instructions keep their relative order: those from the dropped head turns come before
    // the middle's, those from the dropped tail turns after.
    let mut kept = Vec::new();
    let mut extra = Vec::new();
    let mut sort = |m: &Message, kept: &mut Vec<Message>| {
        if m.role.is_instruction() {
            kept.push(m.clone());
        } else {
            extra.push(m.clone());
        }
    };
    msgs[head_end..plan.head_end]
        .iter()
        .for_each(|m| sort(m, &mut kept));
    kept.extend(plan.kept_instructions.iter().cloned());
    msgs[plan.tail_start..tail_start]
        .iter()
        .for_each(|m| sort(m, &mut kept));
    let body = if extra.is_empty() {
        body.to_string()
    } else {
        digest(Some(body), &extra, budget_chars)
    };
    notes.push(format!(
        "escalate: tail cut to {} messages",
        msgs.len() - tail_start
    ));
    let mut tail = msgs[tail_start..].to_vec();
    let candidate = build(plan, &msgs[..head_end], &kept, &body, &tail, &mut notes);
    if best.offer(plan, candidate, &notes) {
        return (best.messages, best.notes);
    }

    // 2. Prune tool outputs and arguments inside the tail as well.
    let stats = prune::prune(&mut tail, usize::MAX, opts, counter);
    if stats.total() > 0 {
        notes.push(format!("escalate: pruned {} in the tail", stats.total()));
    }
    let candidate = build(plan, &msgs[..head_end], &kept, &body, &tail, &mut notes);
    if best.offer(plan, candidate, &notes) {
        return (best.messages, best.notes);
    }

    // 3. Cut single oversized messages down to their beginning and end.
    let cap = (plan.target / 8).max(256);
    let latest = last_user(&tail);
    let mut cut = 0;
    for (i, m) in tail.iter_mut().enumerate() {
        if Some(i) != latest && !m.role.is_instruction() && m.tokens > cap {
            cut += usize::from(truncate(m, chars_for(cap), counter));
        }
    }
    let body = keep_ends(&body, budget_chars * 2 / 3, budget_chars / 3);
    if cut > 0 {
        notes.push(format!("escalate: truncated {cut} messages"));
    }
    let candidate = build(plan, &msgs[..head_end], &kept, &body, &tail, &mut notes);
    if best.offer(plan, candidate, &notes) {
        return (best.messages, best.notes);
    }

    // 4. Last resort: every instruction, the summary, the latest user message.
    let instructions: Vec<Message> = msgs
        .iter()
        .filter(|m| m.role.is_instruction())
        .cloned()
        .collect();
    let latest: Vec<Message> = last_user(msgs)
        .map(|i| msgs[i].clone())
        .into_iter()
        .collect();
    let dropped: Vec<Message> = tail
        .iter()
        .enumerate()
        .filter(|(i, m)| Some(*i) != last_user(&tail) && !m.role.is_instruction())
        .map(|(_, m)| m.clone())
        .collect();
    let fixed = plan.total(&instructions) + plan.total(&latest) - plan.overhead;
    let framing = counter.text(&wrap("")) + 8;
    let room = plan.target.saturating_sub(fixed + framing);
    let room_chars = chars_for(room).min(budget_chars);
    let body = digest(Some(&body), &dropped, room_chars);
    let body = keep_ends(&body, room_chars * 2 / 3, room_chars / 3);
    notes.push("escalate: last resort, instructions + summary + latest user message".into());
    let candidate = build(plan, &instructions, &[], &body, &latest, &mut notes);
    best.offer(plan, candidate, &notes);
    (best.messages, best.notes)
}

/// Keeps the beginning and end of each long text in a message. Returns whether it changed.
fn truncate(m: &mut Message, max_chars: usize, counter: &super::Counter) -> bool {
    let head = max_chars * 2 / 3;
    let tail = max_chars / 3;
    let content = match m.content() {
        Some(Value::String(s)) if s.len() > max_chars => Value::String(keep_ends(s, head, tail)),
        Some(Value::Array(parts)) => {
            let mut changed = false;
            let parts: Vec<Value> = parts
                .iter()
                .map(|p| {
                    let mut p = p.clone();
                    if let Some(Value::String(t)) = p.get_mut("text") {
                        if t.len() > max_chars {
                            *t = keep_ends(t, head, tail);
                            changed = true;
                        }
                    }
                    p
                })
                .collect();
            if !changed {
                return false;
            }
            Value::Array(parts)
        }
        _ => return false,
    };
    let before = m.tokens;
    m.set_content(content, counter);
    m.tokens < before
}
