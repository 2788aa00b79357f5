//! The deterministic digest of the removed middle, written when no LLM summary is
//! available. It keeps what a model continuing the conversation needs, from tool-calling
//! and plain-text agents alike:
//!
//! - every user message (verbatim; a huge one keeps its ends, a long pasted block too),
//!   constraints ("Never modify config/prod.yaml") first among them; a sentence an
//!   earlier request said is not listed again (agents that brief one another restate
//!   their role and rules in every brief);
//! - the assistant's decisions and conclusions, sentence by sentence
//!   ([`scan::decisions`] has the rule);
//! - each error by the line that says what failed ([`error_line`]);
//! - the tool calls and the shell commands of plain-text agents, in order, consecutive
//!   identical ones as one line with a count;
//! - file paths and URLs from call arguments, commands and outputs;
//! - a preview of the last turns before the cut.
//!
//! Observations a plain-text agent gets back as user messages (framed, or raw output
//! answering its command or its program) are read for errors and paths, not kept as
//! requests; a person's words joined after one are the user's own, and a message the
//! client sent after one is read apart though the merge joined it. A path the user forbade modifying
//! is listed as forbidden, never as written. The engine's own placeholders are not
//! history and are left out.
//!
//! Within its budget it drops the least valuable items first (see [`Tier`]). The result
//! is plain Markdown sections that [`Digest::read_previous`] parses back, so the next
//! digest carries this one forward item by item instead of nesting it. Deterministic,
//! and linear in the size of what it reads.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::LazyLock;

use aho_corasick::AhoCorasick;

use super::calls::{self, describe, result_info, CallInfo};
use super::commitment;
use super::decision::{decision, Decision};
use super::envelope::{self, Event};
use super::failing_lines::{error_line, line_score};
use super::media::{PLACEHOLDER_END, PLACEHOLDER_START};
use super::message::{call_id, clip, keep_ends, one_line, Message, Role};
use super::placeholders::{DUPLICATE_PREFIX, PRUNED_PREFIX};
use super::products;
use super::quantity::{self, Amount};
use super::roles::OPENING;
use super::sanitize::STUB;
use super::scan;
use super::summary::{extract, has_marker};
use crate::redact::redact;

const H_EARLIER: &str = "## Earlier summary";
/// Written before a path an output said it wrote (a report, an artefact).
const WRITTEN: &str = "written: ";
/// Written before a path the user said not to modify: never listed as written, whatever
/// a later line says of it.
const FORBIDDEN: &str = "forbidden: ";

/// Headings of earlier versions of the digest, read as the section they became.
const OLD_HEADINGS: &[(&str, Section)] = &[
    ("## User requests, oldest first", Section::Asks),
    ("## Tool calls made", Section::Tools),
    ("## Files touched", Section::Files),
];

/// A digest written in fewer characters than this uses the short headings.
const SHORT_HEADINGS_BELOW: usize = 1000;
/// A digest written in fewer characters than this uses the tight layout: the size below
/// which the summary gets its tight frame too ([`super::summary::wrap`]).
const TIGHT_BELOW: usize = super::summary::TIGHT_FRAME_BELOW;
/// The previews of the last turns before the cut.
const LAST_TURNS: usize = 6;
const LAST_TURN_CHARS: usize = 200;
/// A user message longer than this keeps its beginning and end.
const ASK_HEAD: usize = 1400;
const ASK_TAIL: usize = 600;
/// A fenced block pasted into a user message longer than this keeps its ends.
const FENCE_MAX: usize = 700;
const DECISION_CHARS: usize = 300;
/// What a decision keeps when the digest would otherwise drop a fact.
const DENSE_DECISION: usize = 160;
const ERROR_CHARS: usize = 300;
const LABEL_CHARS: usize = 160;
/// The call an error came from names where it happened, not what failed: kept short.
const WHO_CHARS: usize = 48;
const PATH_CHARS: usize = 200;
/// New paths taken from one output: a `find .` listing is not a list of what mattered.
const PATHS_PER_OUTPUT: usize = 20;
/// Files taken as made from one output: a build that reports every object it wrote is
/// not a list of what mattered.
const PRODUCTS_PER_OUTPUT: usize = 4;
/// A user message that pastes something and says fewer words than this of its own is
/// handing material over rather than asking.
const HANDOVER_WORDS: usize = 12;
/// The newest items of each section that survive the first round of dropping.
const KEEP_NEWEST: usize = 2;
/// What [`super::cut::keep_facts`] writes beyond what it keeps: its note of the cut and
/// the marks around the fact lines.
const FACTS_CUT_NOTE: usize = 64;
/// Rules and numbers a request sets at once from which it reads as a brief.
const BRIEF_RULES: usize = 4;
/// Sentences shorter than this are not looked up as said before.
const SAID_AGAIN_MIN: usize = 24;

/// The digest's sections, in the order they are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    Asks,
    Decisions,
    Errors,
    Tools,
    Files,
    Last,
}

const SECTIONS: [Section; 6] = [
    Section::Asks,
    Section::Decisions,
    Section::Errors,
    Section::Tools,
    Section::Files,
    Section::Last,
];

/// How a digest is written, by its budget: the smaller the digest, the more of it its
/// headings would take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// Descriptive headings, a blank line after each section.
    Long,
    /// One-word headings (`## Errors`), a blank line after each section.
    Short,
    /// One-word headings as a line of their own (`Errors:`), no blank lines: a heading
    /// then costs two tokens, not the four of `\n\n## Errors\n`.
    Tight,
}

impl Layout {
    fn of_budget(budget: usize) -> Layout {
        if budget < TIGHT_BELOW {
            Layout::Tight
        } else if budget < SHORT_HEADINGS_BELOW {
            Layout::Short
        } else {
            Layout::Long
        }
    }
}

impl Section {
    /// The heading written in a digest of this layout.
    fn heading_in(self, layout: Layout) -> &'static str {
        match layout {
            Layout::Long => self.heading(),
            Layout::Short => self.short_heading(),
            Layout::Tight => self.tight_heading(),
        }
    }

    /// What the heading adds to a digest's size: the heading line, and the blank line
    /// before the section after it where the layout has one.
    fn heading_len(self, layout: Layout) -> usize {
        let blank = usize::from(layout != Layout::Tight);
        self.heading_in(layout).len() + 1 + blank
    }

    /// Headings for a digest of a few lines, where the long ones would take a fifth of it
    /// (at a 256-token window an item's worth: the decision or the error line).
    fn short_heading(self) -> &'static str {
        match self {
            Section::Asks => "## Requests",
            Section::Decisions => "## Decisions",
            Section::Errors => "## Errors",
            Section::Tools => "## Calls",
            Section::Files => "## Files",
            Section::Last => "## Last turns",
        }
    }

    /// The short heading's word as a line of its own.
    fn tight_heading(self) -> &'static str {
        match self {
            Section::Asks => "Requests:",
            Section::Decisions => "Decisions:",
            Section::Errors => "Errors:",
            Section::Tools => "Calls:",
            Section::Files => "Files:",
            Section::Last => "Last turns:",
        }
    }

    fn heading(self) -> &'static str {
        match self {
            Section::Asks => "## User requests and constraints, oldest first",
            Section::Decisions => "## Decisions and conclusions",
            Section::Errors => "## Errors seen",
            Section::Tools => "## Tool calls and commands, in order",
            Section::Files => "## Files and paths seen",
            Section::Last => "## Last turns before the cut",
        }
    }

    fn of_heading(line: &str) -> Option<Section> {
        let line = line.trim_end();
        SECTIONS
            .into_iter()
            .find(|s| s.heading() == line || s.short_heading() == line)
            .or_else(|| {
                OLD_HEADINGS
                    .iter()
                    .find(|(h, _)| *h == line)
                    .map(|(_, s)| *s)
            })
    }

    fn of_tight_heading(line: &str) -> Option<Section> {
        let line = line.trim_end();
        SECTIONS.into_iter().find(|s| s.tight_heading() == line)
    }
}

/// Whether `text` is a digest this module wrote, of any layout or version: a heading of
/// ours on a line of its own, or a digest of the tight layout ([`tight_start`]).
fn is_digest(text: &str) -> bool {
    tight_start(text).is_some() || text.lines().any(|l| Section::of_heading(l).is_some())
}

/// The line where a digest of the tight layout starts in `text`: alone, or after an LLM's
/// checkpoint (a chunk whose update was rejected is digested beside it). A line such as
/// `Errors:` may stand in any text, so the digest is known by its whole shape: it opens a
/// paragraph with one of its headings and every line from there to the end is a heading,
/// an item or an item's continuation.
fn tight_start(text: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    // A bare `-`: an item the fit cut to nothing, its space trimmed at the digest's end.
    let ours = |l: &str| {
        l.starts_with("- ")
            || l == "-"
            || l.starts_with("  ")
            || Section::of_tight_heading(l).is_some()
    };
    // The digest is the text's end: the last run of lines of its shape, where it opens.
    let start = lines.len() - lines.iter().rev().take_while(|l| ours(l)).count();
    (start..lines.len()).find(|&i| {
        Section::of_tight_heading(lines[i]).is_some() && (i == 0 || lines[i - 1].trim().is_empty())
    })
}

/// How long an item holds on when the digest is over budget: the lowest tier goes first,
/// oldest first within a tier. What the model cannot get back from the tail, the files or
/// a rerun (what the user asked and forbade) stays longest, then what failed and what was
/// decided; what only says how the work went (previews, the call log) goes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Tier {
    /// Sentences that only narrate the next step ("Let's open the file").
    Narration,
    /// Previews of the last turns.
    Preview,
    /// Tool calls and commands.
    Call,
    /// Paths that only appeared in outputs; announced next steps ("I'll read the
    /// config"); user messages that mostly hand over pasted material.
    Seen,
    /// Paths a call or command acted on.
    Touched,
    /// Errors that say less (a bare `ERROR` line).
    Finding,
    /// The user's requests. Below the facts: a later request or the tail usually says
    /// what is wanted now, while an error, a decision or a written file is said once.
    Ask,
    /// Decisions read from how a sentence is built alone ([`commitment::commits`]), in
    /// a wording no phrase knows: said once, like a fact, but a reading less certain than
    /// an error line, a number or a written file, so in a small digest they give way to
    /// those rather than crowd them out.
    Choice,
    /// Errors that name what failed, decisions and conclusions, steps announced that
    /// are not mere narration ("I'll replace the retry loop"), files an output says it
    /// wrote.
    Fact,
    /// User constraints.
    Rule,
}

const TIERS: [Tier; 10] = [
    Tier::Narration,
    Tier::Preview,
    Tier::Call,
    Tier::Seen,
    Tier::Touched,
    Tier::Finding,
    Tier::Ask,
    Tier::Choice,
    Tier::Fact,
    Tier::Rule,
];

struct Item {
    section: Section,
    tier: Tier,
    /// One line, or several for a user message (written indented under the first).
    text: String,
    /// Consecutive identical tool calls.
    count: usize,
    alive: bool,
    /// A shorter form to fall back on before dropping the item: a user message without
    /// what it pasted.
    short: Option<String>,
    /// The rules and numbers of a user message that sets a rule or states a number,
    /// taken from the whole message (the item may hold only its ends): what it keeps
    /// before a fact is dropped.
    rules: Option<String>,
    /// A path the user forbade modifying.
    forbidden: bool,
    /// A decision said as one ([`Decision::Phrased`]): of its tier, it goes after the
    /// steps announced.
    said_as_choice: bool,
    /// When it was last said, in items pushed so far: a request whose sentences a later
    /// one says again is as recent as that one when items of its tier are given up.
    said_at: usize,
}

impl Item {
    /// What the item is written after: a file the work wrote says so, so that a digest
    /// read back ranks it as the fact it was, not as any path seen.
    fn lead(&self) -> &'static str {
        match self.section {
            Section::Files if self.forbidden => FORBIDDEN,
            Section::Files if self.tier >= Tier::Fact => WRITTEN,
            _ => "",
        }
    }

    /// `- text (xN)\n`, continuation lines indented by two spaces.
    fn rendered_len(&self) -> usize {
        let newlines = self.text.bytes().filter(|&b| b == b'\n').count();
        let count = match self.count {
            0 | 1 => 0,
            n => format!(" (x{n})").len(),
        };
        2 + self.lead().len() + self.text.len() + 2 * newlines + count + 1
    }

    fn render(&self, out: &mut String) {
        out.push_str("- ");
        out.push_str(self.lead());
        out.push_str(&self.text.replace('\n', "\n  "));
        if self.count > 1 {
            out.push_str(&format!(" (x{})", self.count));
        }
        out.push('\n');
    }
}

/// The deterministic digest of `turns`, carrying `previous` (an earlier summary's body)
/// forward, within about `budget_chars` characters. Never empty when there is anything
/// to digest. Secrets are masked.
pub fn digest(previous: Option<&str>, turns: &[Message], budget_chars: usize) -> String {
    digest_in(previous, turns, budget_chars, false, &Beside::default())
}

/// The sentences of what a request keeps whole beside its summary, which no pass cuts:
/// its instructions and its latest user message. A request's sentence said there again
/// is not written into the digest: the model reads it there, and the room goes to what
/// only the digest can say (agents that brief one another restate the task and their
/// rules in every brief, the latest one included).
#[derive(Debug, Default)]
pub struct Beside {
    said: HashSet<String>,
}

impl Beside {
    /// The sentences of the `kept` messages, as [`said_key`] knows them again.
    pub fn of<'m>(kept: impl IntoIterator<Item = &'m Message>) -> Beside {
        let mut said = HashSet::new();
        for m in kept {
            let text = m.text();
            for sentence in text.lines().flat_map(scan::sentences) {
                said.extend(said_key(sentence));
            }
        }
        Beside { said }
    }
}

/// [`digest`] of turns written beside what the request keeps whole ([`Beside`]); where
/// `opens_with_task` (the conversation's task folded in where a request cannot keep it
/// apart), their first request is the goal, and ranks with the facts.
pub fn digest_in(
    previous: Option<&str>,
    turns: &[Message],
    budget_chars: usize,
    opens_with_task: bool,
    beside: &Beside,
) -> String {
    let mut d = Digest::new(budget_chars);
    d.opens_with_task = opens_with_task;
    d.beside = Some(beside);
    if let Some(p) = previous {
        d.read_previous(p);
    }
    d.add_turns(turns);
    d.fit(budget_chars);
    // Items are masked as they are added, so the budget counts the masked text; this
    // catches a secret that only an earlier, foreign summary held.
    redact(&d.render()).into_owned()
}

/// [`shorten`], giving up whole items only: no item at all when none fits whole. For a
/// summary giving way to the task, where the last item cut to its first words ("Don't add
/// new dependencies to") would say what the user did not.
pub fn shorten_to_items(body: &str, budget_chars: usize) -> String {
    if !is_digest(body) {
        return shorten(body, budget_chars);
    }
    let mut d = Digest::new(budget_chars);
    d.read_previous(body);
    d.fit_items(budget_chars, 0);
    redact(&d.render()).into_owned()
}

/// A summary cut to about `budget_chars`: the digest's own format drops its least
/// valuable items and stays parseable; any other text keeps its beginning and end.
pub fn shorten(body: &str, budget_chars: usize) -> String {
    if is_digest(body) {
        digest(Some(body), &[], budget_chars)
    } else {
        // An LLM's checkpoint: its fact lines (errors, rules, written files, decisions,
        // numbers) stay with its ends, so a fact in summary N is still in summary N+1.
        super::cut::keep_facts(body, budget_chars.saturating_sub(FACTS_CUT_NOTE))
    }
}

/// What the assistant message before a user message asked to be run, which the user
/// message may be the output of.
#[derive(Clone, Copy)]
enum Answers {
    Nothing,
    /// A command in a block, or a ReAct-style agent's action.
    Command,
    /// Any message of a text agent that answers in bare commands
    /// ([`scan::bare_command`]).
    Bare,
}

struct Digest<'b> {
    /// Text of earlier summaries not in this format (an LLM's), carried whole.
    earlier: Vec<String>,
    items: Vec<Item>,
    /// Item index by text, per section: each request, decision, error and path once.
    seen: [HashMap<String, usize>; SECTIONS.len()],
    /// The latest tool call, which an identical next call adds to.
    last_call: Option<usize>,
    /// Error item index by the error line alone.
    error_lines: HashMap<String, usize>,
    /// The turns open with the conversation's task (escalation folded its first
    /// exchange in): their first request is the goal, and ranks with the facts.
    opens_with_task: bool,
    /// Paths the user forbade modifying, as their rules name them.
    forbidden: HashSet<String>,
    /// The request that holds each sentence the user said ([`said_key`]), the first to
    /// say it: a sentence said again is not listed again.
    said: HashMap<String, usize>,
    /// What the request keeps whole beside the digest: a sentence said there is left out.
    beside: Option<&'b Beside>,
    /// How it is written: its headings.
    layout: Layout,
    ask_head: usize,
    ask_tail: usize,
}

impl Digest<'_> {
    fn new(budget: usize) -> Self {
        Digest {
            earlier: Vec::new(),
            items: Vec::new(),
            seen: Default::default(),
            last_call: None,
            error_lines: HashMap::new(),
            opens_with_task: false,
            forbidden: HashSet::new(),
            said: HashMap::new(),
            beside: None,
            layout: Layout::of_budget(budget),
            // However large the budget, one message may take a quarter of it at most: a
            // pasted brief or another agent's long prompt would otherwise hold the room
            // of the short facts said after it.
            ask_head: ASK_HEAD.min(budget / 6),
            ask_tail: ASK_TAIL.min(budget / 12),
        }
    }

    /// Reads an earlier summary: this format's sections item by item (old headings
    /// included); anything else (an LLM's summary, say) is carried whole as the
    /// "earlier summary", its headings one level down so they never read as ours.
    fn read_previous(&mut self, text: &str) {
        let mut section: Option<Section> = None;
        let mut earlier = Vec::new();
        let mut pending: Option<(Section, String)> = None;
        let tight = tight_start(text);
        for (i, line) in text.lines().enumerate() {
            let in_tight = tight.is_some_and(|t| i >= t);
            if let Some(s) = Section::of_tight_heading(line).filter(|_| in_tight) {
                self.push_previous(pending.take());
                section = Some(s);
                continue;
            }
            if line.starts_with("## ") {
                self.push_previous(pending.take());
                section = Section::of_heading(line);
                if section.is_none() && line.trim_end() != H_EARLIER {
                    earlier.push(format!("#{line}"));
                }
                continue;
            }
            let Some(s) = section else {
                earlier.push(line.to_string());
                continue;
            };
            if let Some(item) = line.strip_prefix("- ") {
                self.push_previous(pending.take());
                pending = Some((s, item.to_string()));
            } else if let (Some(more), Some((_, text))) = (line.strip_prefix("  "), &mut pending) {
                text.push('\n');
                text.push_str(more);
            }
        }
        self.push_previous(pending);
        let earlier = earlier.join("\n");
        let earlier = earlier.trim();
        if !earlier.is_empty() {
            self.earlier.push(earlier.to_string());
        }
    }

    /// An item read back from an earlier digest, ranked as it would have been.
    fn push_previous(&mut self, item: Option<(Section, String)>) {
        let Some((section, text)) = item else {
            return;
        };
        match section {
            Section::Asks => {
                let whole = text.clone();
                self.push_ask(text, &whole, false);
            }
            Section::Decisions => self.push_decision(&text, &text),
            Section::Errors => {
                // Its error line follows the `who: ` that names the call, unless a
                // short digest wrote it alone; a later occurrence is the same error if it
                // matches the whole item or any tail after a `: `.
                if let Some(at) = self.push(section, Tier::Fact, &text) {
                    self.error_lines.entry(error_key(&text)).or_insert(at);
                    for (colon, _) in text.match_indices(": ") {
                        self.error_lines
                            .entry(error_key(&text[colon + 2..]))
                            .or_insert(at);
                    }
                }
            }
            Section::Tools => {
                let (label, count) = parse_count(&text);
                // Two lines of the same call were two runs of it with a call between them
                // that the digest gave up: read back, they stay two, so a digest carried
                // forward is the digest it was.
                self.last_call = None;
                self.push_call(label.to_string(), count);
            }
            Section::Files => match text.strip_prefix(WRITTEN) {
                Some(path) => {
                    self.push(section, Tier::Fact, path);
                }
                None if text.starts_with(FORBIDDEN) => {
                    let path = &text[FORBIDDEN.len()..];
                    self.forbid(path.to_string());
                    self.push(section, Tier::Touched, path);
                }
                // A path that made it into an earlier digest was worth listing then.
                None => {
                    self.push(section, Tier::Touched, &text);
                }
            },
            Section::Last => {
                self.push(section, Tier::Preview, &text);
            }
        }
    }

    fn add_turns(&mut self, turns: &[Message]) {
        // Filled as the calls go by: a result comes after its call.
        let mut index = HashMap::new();
        // The latest command of a plain-text agent, which the next observation answers.
        let mut command: Option<String> = None;
        // Whether the message before gave a plain-text agent's command: a user message
        // after it that reads as no one's words is its output.
        let mut answers_command = Answers::Nothing;
        // An agent that answers in bare commands (`ls`, a query, no block and no
        // prose), more than once: what comes back after one is the command's output
        // unless it addresses the agent ("No output" is no one's request).
        // An agent that calls tools gets its outputs as tool results.
        // Which assistant messages are programs ([`scan::is_code`]), read once.
        let programs: Vec<bool> = turns
            .iter()
            .map(|m| m.role == Role::Assistant && scan::is_code(&m.text()))
            .collect();
        let text_agent = !turns.iter().any(Message::makes_calls)
            && turns
                .iter()
                .zip(&programs)
                .filter(|(m, &program)| {
                    m.role == Role::Assistant
                        && (program || scan::bare_command(&m.text()).is_some())
                })
                .nth(1)
                .is_some();
        // An agent that acts in code its runtime runs (a code agent), more than once: the
        // user turn after such a message is what the run printed, tool calls or not.
        let code_agent = programs.iter().filter(|&&p| p).nth(1).is_some();
        let mut previews = Vec::new();
        for (i, m) in turns.iter().enumerate() {
            let raw = m.text();
            // A summary folded into a turn is carried like the previous one.
            let raw = match has_marker(&raw).then(|| extract(&raw)).flatten() {
                Some((body, rest)) => {
                    self.read_previous(&body);
                    Cow::Owned(rest)
                }
                None => raw,
            };
            let text = without_placeholders(&raw);
            answers_command = match m.role {
                Role::User => self.read_user(m, &raw, &text, command.as_deref(), answers_command),
                Role::Assistant => {
                    self.add_calls(m, &mut index);
                    if self.add_assistant_text(&text, &mut command) {
                        Answers::Command
                    } else if !(text_agent || (code_agent && programs[i])) {
                        Answers::Nothing
                    } else {
                        // What such an agent's user turn holds after any of its
                        // messages (a command with a comment, a script echoed into a
                        // file) is the environment's answer, unless it addresses the
                        // agent.
                        let run = match scan::bare_command(&text) {
                            Some(bare) => Some(("command", bare)),
                            None if programs[i] => Some(("code", text.trim())),
                            None => None,
                        };
                        if let Some((kind, run)) = run {
                            let label = format!("{kind}: {}", one_line(run, LABEL_CHARS));
                            self.add_paths(run, Tier::Touched);
                            self.push_call(label.clone(), 1);
                            command = Some(label);
                        }
                        Answers::Bare
                    }
                }
                Role::Tool | Role::Function => {
                    let who = result_info(turns, i, &index)
                        .map_or_else(|| "tool".to_string(), |c| c.label());
                    // A pruned output still names its error.
                    self.add_output(&raw, &text, &who);
                    Answers::Nothing
                }
                // Instructions are kept by the engine, never summarised.
                Role::System | Role::Developer => answers_command,
            };
            if i + LAST_TURNS >= turns.len() {
                previews.extend(preview(m, &text, turns, i, &index));
            }
        }
        if !previews.is_empty() {
            // The turns before the new cut replace those before the old one.
            for item in self.items.iter_mut().filter(|i| i.section == Section::Last) {
                item.alive = false;
            }
            for p in previews {
                self.push(Section::Last, Tier::Preview, &p);
            }
        }
        if !turns.is_empty() && self.is_empty() {
            let count = |r: Role| turns.iter().filter(|m| m.role == r).count();
            self.push(
                Section::Last,
                Tier::Preview,
                &format!(
                    "{} messages with nothing to list: {} from the user, {} from the assistant, {} tool results",
                    turns.len(),
                    count(Role::User),
                    count(Role::Assistant),
                    count(Role::Tool) + count(Role::Function)
                ),
            );
        }
    }

    /// A user message (`raw`, and `text` without placeholders), which may answer the
    /// command before it; what the next message answers: a command this one had run.
    fn read_user(
        &mut self,
        m: &Message,
        raw: &str,
        text: &str,
        command: Option<&str>,
        answers: Answers,
    ) -> Answers {
        // An observation and a message the client sent after it, joined: the later one,
        // when it addresses the agent, is a person's words, not more of the output.
        match output_then_words(raw, m.joins_in(raw), answers) {
            Some(at) => {
                self.add_user(&without_placeholders(&raw[..at]), command, answers);
                self.add_user(&without_placeholders(&raw[at..]), command, Answers::Nothing);
            }
            None => self.add_user(text, command, answers),
        }
        if scan::runs_command(raw) {
            Answers::Command
        } else {
            Answers::Nothing
        }
    }

    fn is_empty(&self) -> bool {
        self.earlier.is_empty() && !self.items.iter().any(|i| i.alive)
    }

    /// A user message: an observation a text agent hands back (by its framing, or raw
    /// output answering the command just given), with what a person added after it read
    /// as their own words; else the user's own words.
    fn add_user(&mut self, text: &str, command: Option<&str>, answers: Answers) {
        let text = text.trim();
        if text.is_empty() {
            return;
        }
        // A turn sent as a JSON event: a person's words inside it, or the runtime's.
        match envelope::user_event(text) {
            Some(Event::Said(words)) => return self.add_words(&words),
            Some(Event::Runtime { strings, after }) => {
                self.add_output(text, &strings, "event");
                // A message the client sent after the event, joined to it by the merge.
                return self.add_user(&after, command, answers);
            }
            None => {}
        }
        if is_output(text, answers) {
            // An observation may carry what a person added after it (a run of user
            // messages joined into one): those words are a request like any other.
            let (observation, added) = scan::split_observation(text);
            self.add_output(observation, observation, command.unwrap_or("observation"));
            if !added.is_empty() && !scan::is_observation(added) {
                self.add_words(added);
            }
            return;
        }
        self.add_words(text);
    }

    /// What a person wrote: kept as a request, its constraints, limits and numbers kept
    /// wherever they stand in it.
    fn add_words(&mut self, text: &str) {
        // What the user pasted or quoted is read like an output; their own words are kept.
        self.add_errors(text, "user message");
        // A person's sentence that names a file ("put the report at out/r.html") asks
        // for it; a line they pasted may report it made.
        self.add_products(text, text.lines().filter(|l| !scan::reads_as_speech(l)));
        self.add_paths(text, Tier::Seen);
        // An agent's own status lines (aider's "Applied edit to ...") are not requests.
        let own = scan::without_status_lines(text);
        // A failure the user pasted is listed with the errors: the request keeps the
        // words around it.
        let own: Vec<&str> = own
            .lines()
            .filter(|l| l.trim().is_empty() || !errors_listed(&self.error_lines, l))
            .collect();
        let own = own.join("\n");
        let own = self.not_said_before(own.trim());
        let text = own.trim();
        if text.is_empty() {
            return;
        }
        let cut = |t: &str| tidy(&cut_ask(t, self.ask_head, self.ask_tail));
        let ask = cut(&scan::shorten_fences(text, Some(FENCE_MAX)));
        let words = cut(&scan::shorten_fences(text, None));
        let task = std::mem::take(&mut self.opens_with_task);
        let at = self.push_ask(ask, text, task);
        let Some(item) = at.and_then(|at| self.items.get_mut(at)) else {
            return;
        };
        if words.len() < item.text.len() {
            item.short = Some(redact(&words).into_owned());
        }
        // The task's statement is kept apart in most compactions; its numbers are not
        // worth its words.
        if item.tier < Tier::Fact || (task && item.tier != Tier::Rule) {
            return;
        }
        let said = scan::shorten_fences(text, None);
        let mut tagged = parts_of(&said, true);
        let named = tagged.iter().map(|(p, _)| p.len() + 1).sum::<usize>();
        if said.len() > ASIDE_CHARS && named > self.ask_head + self.ask_tail {
            // A long message that names things everywhere: its rules and numbers alone
            // (its [`salient_parts`]). Not a word in passing, however small the budget
            // that scales the bound: what its few sentences name is said once.
            tagged.retain(|(_, only_named)| !only_named);
        }
        let parts: Vec<Cow<'_, str>> = tagged.into_iter().map(|(part, _)| part).collect();
        let rules = redact(&parts.join(" ")).into_owned();
        item.rules = (!rules.is_empty()).then_some(rules);
        // Cut to its ends, the message may no longer say a rule or a limit it sets (one
        // sentence inside a long line): its rules and numbers stand for it.
        let lost = parts.iter().any(|p| {
            let p = redact(p);
            !item.text.contains(p.trim_end_matches(['.', '!', '?']))
        });
        if lost {
            if let Some(rules) = item.rules.take() {
                item.text = rules;
            }
        }
    }

    /// `text` without the sentences an earlier request said already (agents that brief
    /// one another restate their role, the task and the rules in every brief), nor those
    /// the request keeps whole beside the digest ([`Beside`]): the room a message is cut
    /// to goes to what it says anew. The request that said them first stays at the higher
    /// of its tier and theirs, and as recent as this one.
    fn not_said_before<'t>(&mut self, text: &'t str) -> Cow<'t, str> {
        let mut again: Vec<(usize, &str)> = Vec::new();
        let mut left_out = 0;
        let mut fresh = String::with_capacity(text.len());
        for line in text.lines() {
            let before = (again.len(), left_out);
            let mut kept: Vec<&str> = Vec::new();
            for sentence in scan::sentences(line) {
                let Some(key) = said_key(sentence) else {
                    kept.push(sentence);
                    continue;
                };
                if self.beside.is_some_and(|b| b.said.contains(&key)) {
                    left_out += 1;
                    continue;
                }
                match self
                    .said
                    .get(&key)
                    .copied()
                    .filter(|&at| self.items[at].alive)
                {
                    Some(at) => again.push((at, sentence)),
                    None => kept.push(sentence),
                }
            }
            if (again.len(), left_out) == before {
                fresh.push_str(line);
                fresh.push('\n');
            } else if !kept.is_empty() {
                let indent = &line[..line.len() - line.trim_start().len()];
                fresh.push_str(indent);
                fresh.push_str(&kept.join(" "));
                fresh.push('\n');
            }
        }
        if again.is_empty() && left_out == 0 {
            return Cow::Borrowed(text);
        }
        let now = self.items.len();
        for (at, sentence) in again {
            let tier = ask_tier(sentence, false, false);
            let item = &mut self.items[at];
            item.tier = item.tier.max(tier);
            item.said_at = now;
        }
        Cow::Owned(fresh)
    }

    /// A user message, ranked by what its own words say: a constraint, and the `task`
    /// folded in, above other requests; a message that mostly hands over material ("I ran
    /// it:" and a log) with the paths, since its error and paths are listed on their own.
    /// Ranked by the `whole` message, since a cut to its ends may have left out the
    /// sentence that sets the rule. Returns where a new item went.
    fn push_ask(&mut self, ask: String, whole: &str, task: bool) -> Option<usize> {
        let (own, pasted) = scan::own_words(whole);
        for path in own
            .lines()
            .flat_map(scan::sentences)
            .flat_map(scan::forbidden_paths)
        {
            self.forbid(path);
        }
        self.push(Section::Asks, ask_tier(&own, pasted, task), &ask)
    }

    /// A decision `sentence`, listed as `text`, ranked by how it decides.
    fn push_decision(&mut self, sentence: &str, text: &str) {
        let read = decision(sentence);
        if let Some(at) = self.push(Section::Decisions, tier_of(read), text) {
            self.items[at].said_as_choice |= read == Decision::Phrased;
        }
    }

    /// An assistant's decisions and commands; whether it gave a command.
    fn add_assistant_text(&mut self, text: &str, command: &mut Option<String>) -> bool {
        let mut commanded = false;
        for (sentence, _) in scan::decisions(text) {
            self.push_decision(&sentence, &one_line(&sentence, DECISION_CHARS));
        }
        for cmd in scan::commands(text) {
            let label = format!("command: {}", one_line(&cmd, LABEL_CHARS));
            self.add_paths(&cmd, Tier::Touched);
            self.push_call(label.clone(), 1);
            *command = Some(label);
            commanded = true;
        }
        commanded
    }

    /// The calls an assistant message makes, each also put in `index` under its id for
    /// the results that follow (an id used again later then names the later call).
    fn add_calls(&mut self, m: &Message, index: &mut HashMap<String, CallInfo>) {
        let mut infos = Vec::with_capacity(m.tool_calls().len());
        for call in m.tool_calls() {
            // What the agent said through a tool: its words, not a command it gave.
            if let Some(said) = calls::spoken(call) {
                self.add_assistant_text(&said, &mut None);
            }
            let info = CallInfo::from_call(call);
            if let Some(id) = call_id(call) {
                index.insert(id.to_string(), info.clone());
            }
            infos.push(info);
        }
        infos.extend(m.function_call().map(|f| {
            describe(
                f.get("name").and_then(|v| v.as_str()).unwrap_or("function"),
                f.get("arguments").and_then(|v| v.as_str()).unwrap_or(""),
            )
        }));
        for info in infos {
            // `.` and `/` name no file.
            for f in info
                .files
                .iter()
                .filter(|f| f.bytes().any(|b| b.is_ascii_alphabetic()))
            {
                self.push(Section::Files, Tier::Touched, &one_line(f, PATH_CHARS));
            }
            // A command or query argument names paths too.
            if let Some((_, value)) = &info.target {
                self.add_paths(value, Tier::Touched);
            }
            self.push_call(one_line(&info.label(), LABEL_CHARS), 1);
        }
    }

    /// A tool's output, or an observation handed back as a user message: its error and
    /// the paths it names. `raw` still holds a pruned output's placeholder, which names
    /// the error the output had.
    fn add_output(&mut self, raw: &str, text: &str, who: &str) {
        if raw.starts_with(PRUNED_PREFIX) {
            if let Some(err) = error_line(raw) {
                self.push_error(who, err, Tier::Fact);
            }
        }
        // An output sent as JSON is read by its strings' lines.
        let decoded = envelope::output_strings(text);
        let text = decoded.as_deref().unwrap_or(text);
        self.add_errors(text, who);
        self.add_products(text, text.lines());
        self.add_paths(text, Tier::Seen);
    }

    /// The files an output reports it made ([`products::reported_paths`]): ranked with
    /// what the work wrote, the state a later turn builds on, where a path that only
    /// appeared in an output goes first.
    fn add_products<'a>(&mut self, text: &'a str, lines: impl Iterator<Item = &'a str>) {
        // A whole output is looked at once for a path before its lines are.
        if !text.contains(['/', '.']) {
            return;
        }
        let mut made = 0;
        for line in lines {
            products::reported_paths(line, |path| {
                made += usize::from(self.push(Section::Files, Tier::Fact, path).is_some());
                made < PRODUCTS_PER_OUTPUT
            });
            if made == PRODUCTS_PER_OUTPUT {
                break;
            }
        }
    }

    /// The lines of an output that report a failure, the most telling first (see
    /// [`error_lines`]).
    fn add_errors(&mut self, text: &str, who: &str) {
        for (score, line) in error_lines(text) {
            let tier = if score >= 4 {
                Tier::Fact
            } else {
                Tier::Finding
            };
            self.push_error(who, line, tier);
        }
    }

    /// An error, listed once however often it recurs (by whichever call met it first):
    /// an agent meets the same failure again and again until it fixes it.
    fn push_error(&mut self, who: &str, err: String, tier: Tier) {
        let key = error_key(&err);
        let at = self.error_lines.get(&key).copied();
        match at.and_then(|at| self.items.get_mut(at)) {
            Some(item) => {
                item.alive = true;
                item.tier = item.tier.max(tier);
            }
            None => {
                // A digest of a few lines lists the error line alone: the call it came
                // from ("user message: ", "bash command=pytest tests/: ") costs 3-12
                // tokens, a third of an error line, and at a 256-token window that is
                // the room of the next decision or error (bench/results/fidelity-2026-11-26e.md).
                let line = if self.layout != Layout::Long {
                    err
                } else {
                    format!("{}: {err}", one_line(who, WHO_CHARS))
                };
                if let Some(at) = self.push(Section::Errors, tier, &line) {
                    self.error_lines.insert(key, at);
                }
            }
        }
    }

    /// Paths are one short word each ([`scan::paths`]): no flattening needed.
    fn add_paths(&mut self, text: &str, tier: Tier) {
        let mut new = 0;
        scan::paths(text, |p| {
            new += usize::from(self.push(Section::Files, tier, p).is_some());
            new < PATHS_PER_OUTPUT
        });
    }

    /// Adds an item, masked, and returns where it went; a repeat raises the first one's
    /// tier instead. Most texts hold no secret and match an earlier item as they are, so
    /// only a text not seen yet is masked.
    fn push(&mut self, section: Section, tier: Tier, text: &str) -> Option<usize> {
        if text.is_empty() {
            return None;
        }
        let seen = &self.seen[section as usize];
        let masked = match seen.get(text) {
            Some(&at) => return self.revive(at, tier),
            None => redact(text),
        };
        if let Some(&at) = seen.get(masked.as_ref()) {
            return self.revive(at, tier);
        }
        let text = masked.into_owned();
        let at = self.items.len();
        self.seen[section as usize].insert(text.clone(), at);
        let forbidden = section == Section::Files && self.is_forbidden(&text);
        self.items.push(Item {
            section,
            tier,
            text,
            count: 1,
            alive: true,
            short: None,
            rules: None,
            forbidden,
            said_as_choice: false,
            said_at: at,
        });
        if section == Section::Asks {
            for sentence in self.items[at].text.lines().flat_map(scan::sentences) {
                if let Some(key) = said_key(sentence) {
                    self.said.entry(key).or_insert(at);
                }
            }
        }
        Some(at)
    }

    /// Notes a path the user forbade modifying, and marks it where it is listed already.
    fn forbid(&mut self, path: String) {
        if !self.forbidden.insert(path) {
            return;
        }
        for at in 0..self.items.len() {
            let item = &self.items[at];
            if item.section == Section::Files && !item.forbidden && self.is_forbidden(&item.text) {
                self.items[at].forbidden = true;
            }
        }
    }

    /// Whether `path` is one the user forbade, as they named it or under a directory
    /// (`/repo/config/prod.yaml` for `config/prod.yaml`).
    fn is_forbidden(&self, path: &str) -> bool {
        self.forbidden.iter().any(|f| {
            path == f
                || path
                    .strip_suffix(f.as_str())
                    .is_some_and(|dir| dir.ends_with('/'))
        })
    }

    /// An item met again: it stays, at the higher of its tiers.
    fn revive(&mut self, at: usize, tier: Tier) -> Option<usize> {
        let item = &mut self.items[at];
        item.tier = item.tier.max(tier);
        item.alive = true;
        None
    }

    /// Adds a call to the log, or counts it on the previous line when it is the same.
    fn push_call(&mut self, label: String, count: usize) {
        let label = redact(&label).into_owned();
        if let Some(item) = self.last_call.and_then(|at| self.items.get_mut(at)) {
            if item.text == label {
                item.count += count;
                return;
            }
        }
        let at = self.items.len();
        self.last_call = Some(at);
        self.items.push(Item {
            section: Section::Tools,
            tier: Tier::Call,
            text: label,
            count,
            alive: true,
            short: None,
            rules: None,
            forbidden: false,
            said_as_choice: false,
            said_at: at,
        });
    }

    /// Makes the digest fit `budget`, giving up the least valuable first:
    ///
    /// 1. the previews of the last turns, oldest first;
    /// 2. what user messages pasted (their own words stay, and the pasted errors and
    ///    paths are listed on their own), oldest first;
    /// 3. the other items below [`Tier::Finding`], lowest tier and oldest first, sparing the
    ///    newest few of each section so the call log and the paths keep their latest
    ///    entries;
    /// 4. what a rule-setting user message says besides its rules, its numbers and (where
    ///    no rule was read in it) the sentences that name something;
    /// 5. the end of a long decision, beyond its first [`DENSE_DECISION`] characters;
    /// 6. the rules of a brief ([`BRIEF_RULES`] or more) that name nothing the model could
    ///    not guess;
    /// 7. a path another item names, unless its line says the work wrote it;
    /// 8. the plain requests but the newest few, oldest first, then what step 4 left of a
    ///    message beside its rules and numbers;
    /// 9. any item, lowest tier and oldest first (a request said again counts as said
    ///    when it was last said; among decisions of a tier, steps announced before
    ///    choices said as one).
    ///
    /// The last item standing is cut rather than dropped, so the digest is never empty.
    fn fit(&mut self, budget: usize) {
        if let Some(size) = self.fit_items(budget, 1) {
            if let Some(item) = self.items.iter_mut().find(|i| i.alive) {
                let room = (budget + item.text.len()).saturating_sub(size);
                item.text = cut_to(&item.text, room);
            }
        }
    }

    /// [`Digest::fit`] by dropping items whole, down to `least` of them; the size when
    /// the digest is still over `budget`.
    fn fit_items(&mut self, budget: usize, least: usize) -> Option<usize> {
        let earlier_len: usize = self.earlier.iter().map(|e| e.len() + 2).sum();
        if earlier_len > budget / 2 {
            let joined = self.earlier.join("\n\n");
            self.earlier = vec![super::cut::keep_facts(&joined, budget / 2)];
        }
        let mut size = self.rendered_len();
        if size <= budget {
            return None;
        }
        // What this fit drops may come back into room a later drop left.
        let mut refill: Vec<bool> = self.items.iter().map(|i| i.alive).collect();
        let mut spared = vec![false; self.items.len()];
        let mut per_section = [0; SECTIONS.len()];
        for (i, item) in self.items.iter().enumerate().rev().filter(|(_, i)| i.alive) {
            let n = &mut per_section[item.section as usize];
            spared[i] = *n < KEEP_NEWEST;
            *n += 1;
        }
        // Lowest tier first; within a tier, what was said longest ago (the order items
        // were pushed in, but for a request said again: a stable sort of runs already
        // in order is linear), taken from the section that holds the most of the tier
        // first, so that one kind (the ninth file written) never crowds out another
        // (the one decision), and a digest read back, its items in the order of its
        // sections, gives them up as fairly.
        let mut order: Vec<usize> = TIERS
            .into_iter()
            .flat_map(|t| {
                let items = &self.items;
                (0..items.len()).filter(move |&i| items[i].alive && items[i].tier == t)
            })
            .collect();
        // Among the decisions of a tier, a step announced goes before a choice said as
        // one ("Decision: ...", "we'll go with ..."): the turns after a step usually show
        // it done.
        order.sort_by_key(|&i| {
            let item = &self.items[i];
            (item.tier, item.said_as_choice, item.said_at)
        });
        for run in order.chunk_by_mut(|&a, &b| self.items[a].tier == self.items[b].tier) {
            fair_share(run, &self.items);
        }
        let mut left = Left {
            budget,
            size,
            per_section,
            standing: per_section.iter().sum(),
            least,
            layout: self.layout,
        };
        left.drop(&mut self.items, &order, |_, item| {
            item.tier <= Tier::Preview
        });
        left.unpaste(&mut self.items, &mut refill);
        left.drop(&mut self.items, &order, |i, item| {
            !spared[i] && item.tier < Tier::Finding
        });
        left.shorten_facts(&mut self.items);
        // A path that another item names already (the rule that forbids it, the request
        // that asks to edit it) says nothing more as a line of its own, unless the line
        // says the work wrote it. Asked once the items have their shortest texts: a
        // request that gave up its paste may no longer name it.
        let paths = PathNames::of(&self.items);
        let echoed = paths.echoed(&self.items);
        left.drop(&mut self.items, &order, |i, _| echoed[i]);
        // A sentence of the user's that names something, beside a number they stated, is
        // said once; an older plain request, a later turn usually says again. A rule in
        // a wording no reading knows is such a sentence, and is kept the longer for it.
        left.drop(&mut self.items, &order, |i, item| {
            !spared[i] && item.tier <= Tier::Ask
        });
        left.shorten_to_salient(&mut self.items);
        left.drop(&mut self.items, &order, |_, _| true);
        // Items go whole, oldest first, so the last one dropped may leave more room than
        // the excess it had to cover: a smaller one dropped before it fits there again
        // (at a 256-token window an error line, after a decision made the room). The
        // most valuable come back first, the newest first within a tier.
        if left.size <= budget {
            // Not a path that what is left still names.
            let echoed = paths.echoed(&self.items);
            for &i in order.iter().rev() {
                if echoed[i] {
                    continue;
                }
                if refill[i] && !self.items[i].alive {
                    left.put_back(&mut self.items[i]);
                }
            }
        }
        size = left.size;
        if size > budget && !self.earlier.is_empty() {
            let joined = self.earlier.join("\n\n");
            self.earlier = vec![super::cut::keep_facts(&joined, budget / 3)];
            size = self.rendered_len();
        }
        (size > budget).then_some(size)
    }

    /// An upper bound on the length of [`Digest::render`]'s text.
    fn rendered_len(&self) -> usize {
        let mut len: usize = self.earlier.iter().map(|e| e.len() + 2).sum();
        if len > 0 {
            len += H_EARLIER.len() + 2;
        }
        let mut headed = [false; SECTIONS.len()];
        for item in self.items.iter().filter(|i| i.alive) {
            len += item.rendered_len();
            let s = item.section as usize;
            if !headed[s] {
                headed[s] = true;
                len += item.section.heading_len(self.layout);
            }
        }
        len
    }

    fn render(&self) -> String {
        let mut out = String::with_capacity(self.rendered_len());
        if !self.earlier.is_empty() {
            out.push_str(H_EARLIER);
            out.push('\n');
            out.push_str(&self.earlier.join("\n\n"));
            out.push_str("\n\n");
        }
        let mut by_section: [Vec<&Item>; SECTIONS.len()] = Default::default();
        for item in self.items.iter().filter(|i| i.alive) {
            by_section[item.section as usize].push(item);
        }
        for (s, items) in SECTIONS.into_iter().zip(by_section) {
            if items.is_empty() {
                continue;
            }
            out.push_str(s.heading_in(self.layout));
            out.push('\n');
            for item in items {
                item.render(&mut out);
            }
            if self.layout != Layout::Tight {
                out.push('\n');
            }
        }
        out.trim_end().to_string()
    }
}

/// The path items a fit may find named by other items, and the automaton that finds them:
/// built once per fit (the items' paths do not change in it), asked before the last drops
/// and again before the refill.
struct PathNames {
    /// Indexes of the path items, but for the files the work wrote (their line says more
    /// than the path).
    paths: Vec<usize>,
    names: Option<AhoCorasick>,
}

impl PathNames {
    fn of(items: &[Item]) -> PathNames {
        let paths: Vec<usize> = (0..items.len())
            .filter(|&i| items[i].section == Section::Files && items[i].lead() != WRITTEN)
            .collect();
        let names = if paths.is_empty() {
            None
        } else {
            AhoCorasick::new(paths.iter().map(|&i| &items[i].text)).ok()
        };
        PathNames { paths, names }
    }

    /// Which path items a living item of another section and no lower tier names (a call
    /// log line that names one goes first).
    fn echoed(&self, items: &[Item]) -> Vec<bool> {
        let mut echoed = vec![false; items.len()];
        let Some(names) = &self.names else {
            return echoed;
        };
        for item in items
            .iter()
            .filter(|i| i.alive && i.section != Section::Files)
        {
            for m in names.find_overlapping_iter(&item.text) {
                let at = self.paths[m.pattern().as_usize()];
                echoed[at] |=
                    item.tier >= items[at].tier && names_whole(&item.text, m.start(), m.end());
            }
        }
        echoed
    }
}

/// Whether `text[start..end]` stands as a name of its own: `app.py` in "edit app.py.",
/// not in "webapp.py" nor "app.py.bak".
fn names_whole(text: &str, start: usize, end: usize) -> bool {
    let part = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'/' | b'-');
    let bytes = text.as_bytes();
    let before = start.checked_sub(1).map(|i| bytes[i]);
    let after = bytes.get(end).copied();
    let goes_on = match after {
        Some(b'.') => bytes.get(end + 1).is_some_and(|&b| part(b)),
        Some(b) => part(b),
        None => false,
    };
    !before.is_some_and(|b| part(b) || b == b'.') && !goes_on
}

/// Orders `run` (items of one tier, oldest first) to be given up one at a time from the
/// section holding the most of them still, the oldest of it first; between sections
/// holding as many, the older item first.
fn fair_share(run: &mut [usize], items: &[Item]) {
    let mut by_section: [VecDeque<usize>; SECTIONS.len()] = Default::default();
    for &i in run.iter() {
        by_section[items[i].section as usize].push_back(i);
    }
    for slot in run.iter_mut() {
        let next = by_section
            .iter_mut()
            .filter(|q| !q.is_empty())
            .max_by_key(|q| (q.len(), std::cmp::Reverse(items[q[0]].said_at)));
        if let Some(i) = next.and_then(VecDeque::pop_front) {
            *slot = i;
        }
    }
}

/// Where [`Digest::fit`] stands: the rendered size and how many items are left.
struct Left {
    budget: usize,
    size: usize,
    per_section: [usize; SECTIONS.len()],
    standing: usize,
    /// Items never dropped.
    least: usize,
    layout: Layout,
}

impl Left {
    /// Drops the items in `order` that `may` allows until the digest fits, keeping `least`.
    fn drop(&mut self, items: &mut [Item], order: &[usize], may: impl Fn(usize, &Item) -> bool) {
        for &i in order {
            if self.size <= self.budget || self.standing <= self.least {
                return;
            }
            let item = &mut items[i];
            if item.alive && may(i, item) {
                self.kill(item);
            }
        }
    }

    /// Gives user messages their words without what they pasted, in order, until the
    /// digest fits. A message without its paste may read like another: it is then said
    /// already, and dropped for good (`refill` no longer brings it back).
    fn unpaste(&mut self, items: &mut [Item], refill: &mut [bool]) {
        let mut asks: HashSet<String> = items
            .iter()
            .filter(|i| i.alive && i.section == Section::Asks)
            .map(|i| i.text.clone())
            .collect();
        for (i, item) in items.iter_mut().enumerate().filter(|(_, i)| i.alive) {
            if self.size <= self.budget {
                return;
            }
            let Some(short) = item.short.take() else {
                continue;
            };
            if asks.contains(&short) {
                refill[i] = false;
                self.kill(item);
                continue;
            }
            asks.remove(&item.text);
            self.size -= item.rendered_len();
            item.text = short;
            self.size += item.rendered_len();
            asks.insert(item.text.clone());
        }
    }

    /// Gives the items that `shorter` has a shorter text for that text, in order, until
    /// the digest fits.
    fn shorten(
        &mut self,
        items: &mut [Item],
        mut shorter: impl FnMut(&mut Item) -> Option<String>,
    ) {
        for item in items.iter_mut().filter(|i| i.alive) {
            if self.size <= self.budget {
                return;
            }
            if let Some(text) = shorter(item) {
                self.size -= item.rendered_len();
                item.text = text;
                self.size += item.rendered_len();
            }
        }
    }

    /// Steps 4 to 6 of [`Digest::fit`]: the items that say a fact in fewer words than
    /// they hold are given those words, until the digest fits.
    fn shorten_facts(&mut self, items: &mut [Item]) {
        // A message that sets a rule keeps its rules and its numbers before any fact of
        // the same rank is given up: its other words (a greeting, a pasted token, "carry
        // on") say least per character. Where no reading found a rule in it, it keeps
        // what it names too ([`kept_parts`]), given up after the older plain requests
        // ([`Left::shorten_to_salient`]).
        self.shorten(items, |item| {
            // A rule, or a message that states a number.
            let holds = item.tier == Tier::Rule || item.rules.is_some();
            if item.section != Section::Asks || !holds {
                return None;
            }
            let rules = item
                .rules
                .take()
                .unwrap_or_else(|| rules_and_numbers(&item.text));
            let shorter = !rules.is_empty() && rules.len() < item.text.len();
            let bare = salient_parts(&rules).join(" ");
            item.rules = (shorter && !bare.is_empty() && bare.len() < rules.len()).then_some(bare);
            shorter.then_some(rules)
        });
        // A long decision gives up its end before a fact is dropped whole: its first
        // words state it (the rest is mostly the reasoning, or the next sentence run on
        // without a space), and the room pays for another fact.
        self.shorten(items, |item| {
            let long = item.section == Section::Decisions && item.text.len() > DENSE_DECISION;
            long.then(|| one_line(&item.text, DENSE_DECISION))
        });
        // A brief (a request setting many rules at once, as another agent's prompt does)
        // keeps the rules that name something the model could not guess (a file, a
        // branch, a limit) before a fact is dropped whole: its general ones ("write
        // complete code") the next brief usually says again.
        self.shorten(items, |item| {
            if item.section != Section::Asks || item.tier != Tier::Rule {
                return None;
            }
            let parts = salient_parts(&item.text);
            if parts.len() < BRIEF_RULES {
                return None;
            }
            let named: Vec<&str> = parts
                .iter()
                .map(|p| p.as_ref())
                .filter(|p| commitment::names_something(p))
                .collect();
            (!named.is_empty() && named.len() < parts.len()).then(|| named.join(" "))
        });
    }

    /// What a message that sets a rule or states a number names besides its rules and
    /// numbers, given up after [`Left::shorten_facts`] and the older plain requests, still
    /// before a fact is given up whole.
    fn shorten_to_salient(&mut self, items: &mut [Item]) {
        self.shorten(items, |item| {
            item.rules.take().filter(|_| item.section == Section::Asks)
        });
    }

    /// Brings a dropped item back if it fits within the budget.
    fn put_back(&mut self, item: &mut Item) {
        let n = self.per_section[item.section as usize];
        let heading = if n == 0 {
            item.section.heading_len(self.layout)
        } else {
            0
        };
        let size = self.size + item.rendered_len() + heading;
        if size > self.budget {
            return;
        }
        item.alive = true;
        self.size = size;
        self.standing += 1;
        self.per_section[item.section as usize] += 1;
    }

    fn kill(&mut self, item: &mut Item) {
        item.alive = false;
        self.size -= item.rendered_len();
        self.standing -= 1;
        let n = &mut self.per_section[item.section as usize];
        *n -= 1;
        if *n == 0 {
            self.size -= item.section.heading_len(self.layout);
        }
    }
}

/// Where, in a user message that joins several the client sent, an output ends and a
/// person's words begin: the first message joined after an output that holds prose and
/// says something to the agent ([`scan::says_to_agent`]: a rule, a limit, a word said to
/// someone), not framed as another output. A tool's own prose ("Saved the results to
/// ...") is not.
fn output_then_words(text: &str, joins: &[usize], answers: Answers) -> Option<usize> {
    let first = joins.first()?;
    if !is_output(&text[..*first], answers) {
        return None;
    }
    joins.iter().copied().find(|&at| {
        // A message of its own: a line of prose in it will do, under a frame
        // ("[from the user]", "ADMIN") that no sentence starts.
        let part = &text[at..];
        scan::has_prose(part) && scan::says_to_agent(part) && !scan::is_observation(part)
    })
}

/// Whether the user message `m` hands back an output and nothing else, read by the
/// message `before` it alone: framed as an observation, or the answer to a command that
/// message gave (a block or an action of the assistant's, a command the user had run)
/// that reads as no one's words. Escalation asks it of the latest user message, which
/// it then cuts like the latest output of a tool; the digest reads a run of turns so.
pub fn hands_back_output(before: Option<&Message>, m: &Message) -> bool {
    if m.role != Role::User {
        return false;
    }
    let answers = match before {
        Some(b) if b.role == Role::Assistant && !scan::commands(&b.text()).is_empty() => {
            Answers::Command
        }
        Some(b) if b.role == Role::User && scan::runs_command(&b.text()) => Answers::Command,
        _ => Answers::Nothing,
    };
    let text = m.text();
    let (_, added) = scan::split_observation(&text);
    is_output(&text, answers) && added.trim().is_empty()
}

/// Whether a user message hands back an output: by its framing, or as the answer to a
/// command the message before gave that reads as no one's words.
fn is_output(text: &str, answers: Answers) -> bool {
    let text = text.trim();
    let answered = match answers {
        Answers::Nothing => false,
        Answers::Command => !scan::reads_as_words(text),
        Answers::Bare => !scan::addresses_agent(text),
    };
    answered || scan::is_observation(text)
}

/// The tier of a user message by its `own` words: a constraint above other requests; one
/// that mostly hands over `pasted` material ("I ran it:" and a log), or holds no prose at
/// all, with the paths, since its error and paths are listed on their own.
fn ask_tier(own: &str, pasted: bool, task: bool) -> Tier {
    let amount = quantity::amount(own);
    if scan::is_constraint(own) || amount == Some(Amount::Limit) {
        Tier::Rule
    } else if pasted && own.split_whitespace().count() < HANDOVER_WORDS {
        Tier::Seen
    } else if !task && !scan::has_prose(own) {
        // Not a line of prose (a log, a listing, a table handed over raw, or an
        // environment's answer no rule read as one): material handed over as well.
        Tier::Seen
    } else if task || amount.is_some() {
        // The task, folded in, is the goal; but it is kept apart in most compactions, so
        // it ranks with the facts, not the rules. A number the user states (a size, a
        // count, an id) is said once, like an error or a decision. A later request is no
        // goal for being the oldest the digest holds: the task stands before it, and a
        // later turn usually says what is wanted now.
        Tier::Fact
    } else {
        Tier::Ask
    }
}

/// A sentence as [`Digest::not_said_before`] recognises it said again: its words with
/// single spaces between them; `None` for one too short to be worth the lookup ("Thanks.",
/// "Go on."), which says little either way.
fn said_key(sentence: &str) -> Option<String> {
    if sentence.len() < SAID_AGAIN_MIN {
        return None;
    }
    let mut key = String::with_capacity(sentence.len());
    for word in sentence.split_whitespace() {
        if !key.is_empty() {
            key.push(' ');
        }
        key.push_str(word);
    }
    (key.len() >= SAID_AGAIN_MIN).then_some(key)
}

/// The tier of a decision sentence, by how it decides: one said by a phrase or a step
/// that names what it acts on is a fact; a step that only narrates goes first; one read
/// from its build alone is a [`Tier::Choice`].
fn tier_of(decision: Decision) -> Tier {
    match decision {
        Decision::Phrased | Decision::Step => Tier::Fact,
        Decision::Committed => Tier::Choice,
        Decision::Narration => Tier::Narration,
        Decision::Unnamed => Tier::Seen,
    }
}

/// Error lines taken from one output; more are one failure told several ways.
const ERRORS_PER_OUTPUT: usize = 3;

/// Where an error line was found, ordered so that a later place wins a tie of scores: the
/// best line ([`error_line`]) is compared as later than every numbered line, so it stands
/// first among lines scored as high.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Place {
    Line(usize),
    Best,
}

/// The lines of `text` that report a failure, with their scores
/// ([`super::failing_lines::line_score`]), the highest first and among equals the latest (an
/// output's last lines say how it ended): the best line as the error list always took it
/// (a Python traceback by its exception), each other line that names what failed, and the
/// last line that reports a failure at all. Lines of a file shown with their numbers are
/// code, not reports; a line the best one already holds adds nothing.
fn error_lines(text: &str) -> Vec<(u8, String)> {
    let mut found: Vec<(u8, Place, String)> = Vec::new();
    if let Some(best) = error_line(text) {
        if !scan::is_numbered_line(&best) {
            found.push((line_score(&best).max(4), Place::Best, best));
        }
    }
    let mut last: Option<(u8, Place, String)> = None;
    for (i, line) in text.lines().enumerate() {
        if line.len() > 4 * ERROR_CHARS || scan::is_numbered_line(line) {
            continue;
        }
        let score = line_score(line);
        if score < 2 {
            continue;
        }
        let line = one_line(line, ERROR_CHARS);
        if found.iter().any(|(_, _, l)| l.contains(line.as_str())) {
            continue;
        }
        if score >= 4 {
            found.push((score, Place::Line(i), line));
        } else {
            last = Some((score, Place::Line(i), line));
        }
    }
    found.extend(last);
    found.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    found.truncate(ERRORS_PER_OUTPUT);
    found.into_iter().map(|(s, _, l)| (s, l)).collect()
}

/// An error line with its numbers blanked: the same failure counted on another run
/// (`test result: FAILED. 22 passed; 1 failed`) is listed once.
fn error_key(line: &str) -> String {
    let mut key = String::with_capacity(line.len());
    for c in line.chars() {
        if c.is_ascii_digit() {
            if !key.ends_with('#') {
                key.push('#');
            }
        } else {
            key.push(c);
        }
    }
    key
}

/// Whether every line of `text` is an error line the digest lists already (`listed`, by
/// [`error_key`]): a user who pastes a failure asks nothing a second listing of it adds.
fn errors_listed(listed: &HashMap<String, usize>, text: &str) -> bool {
    let is_listed = |l: &str| listed.contains_key(&error_key(l));
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .all(|l| is_listed(l) || is_listed(l.trim_end_matches(['.', '!'])))
}

/// `label (x3)` as the label and its count.
fn parse_count(item: &str) -> (&str, usize) {
    if let Some(open) = item.rfind(" (x") {
        if let Some(n) = item[open + 3..]
            .strip_suffix(')')
            .and_then(|n| n.parse().ok())
        {
            return (&item[..open], n);
        }
    }
    (item, 1)
}

/// Whether a line is one the engine wrote in place of something it removed.
fn is_placeholder(line: &str) -> bool {
    let t = line.trim();
    t == OPENING
        || t == STUB.trim()
        || t.starts_with(PRUNED_PREFIX)
        || t.starts_with(DUPLICATE_PREFIX)
        || (t.starts_with(PLACEHOLDER_START) && t.ends_with(PLACEHOLDER_END))
}

/// The text without the engine's placeholder lines.
fn without_placeholders(text: &str) -> Cow<'_, str> {
    // One search over the text first: it runs on every message, most hold none.
    static STARTS: LazyLock<Option<AhoCorasick>> = LazyLock::new(|| {
        AhoCorasick::new([
            OPENING,
            STUB.trim(),
            PRUNED_PREFIX,
            DUPLICATE_PREFIX,
            PLACEHOLDER_START,
        ])
        .ok()
    });
    let any = STARTS.as_ref().is_none_or(|ac| ac.is_match(text));
    if !any || !text.lines().any(is_placeholder) {
        return Cow::Borrowed(text);
    }
    let kept: Vec<&str> = text.lines().filter(|l| !is_placeholder(l)).collect();
    Cow::Owned(kept.join("\n"))
}

/// A multi-line item's lines without trailing blanks, and without empty lines, which
/// would be written as lines of bare indentation.
fn tidy(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect();
    lines.join("\n")
}

/// A long user message in about `head + tail` characters: its ends, unless lines in
/// between state facts (a rule it sets, an error, a written file): then its beginning and
/// those lines, which may take two thirds of the room.
fn cut_ask(text: &str, head: usize, tail: usize) -> String {
    // Masked first: the opening is clipped where it falls, and a clip through a key keeps
    // part of it without the prefix the redactor knows it by.
    let text = &*redact(text);
    let keep = head + tail;
    if text.len() <= keep + 64 {
        return text.to_string();
    }
    let opening = clip(text, (keep / 3).max(64).min(keep));
    let facts: Vec<String> = super::cut::said_within(&text[opening.len()..], keep * 2 / 3);
    if facts.is_empty() {
        return keep_ends(text, head, tail);
    }
    let facts_len: usize = facts.iter().map(|f| f.len() + 1).sum();
    let head = clip(text, keep.saturating_sub(facts_len).max(opening.len()));
    let rest = &text[head.len()..];
    let facts: Vec<&String> = facts
        .iter()
        .filter(|f| rest.contains(f.as_str()) || !head.contains(f.as_str()))
        .collect();
    let shown: usize = facts.iter().map(|f| f.len()).sum();
    let cut = rest.len().saturating_sub(shown);
    let facts: Vec<&str> = facts.iter().map(|f| f.as_str()).collect();
    format!(
        "{head}\n[... {cut} characters omitted by compaction ...]\n{}",
        facts.join("\n")
    )
}

/// A user message reduced to what it asks to hold: its [`salient_parts`] on one line.
/// Empty when it holds none.
fn rules_and_numbers(text: &str) -> String {
    kept_parts(text).join(" ")
}

/// Each sentence of a user message that sets a rule, whole, and each number that says
/// something ([`quantity::amount`]: a limit, a size with its unit, a count or an id) in
/// the clause that says what it counts, in their order.
fn salient_parts(text: &str) -> Vec<Cow<'_, str>> {
    untagged(parts_of(text, false))
}

/// What a message that sets a rule or states a number keeps of its words when it gives up
/// the rest: its [`salient_parts`], and where no reading finds a rule in it, each other
/// sentence that names something the model could not guess (a file, a branch, an
/// identifier: [`commitment::names_something`]). A rule in a wording no reading knows
/// ("customers still call the v1 endpoints every day") still names what it is about, and is
/// said once, where the greeting and the "carry on" around it name nothing.
fn kept_parts(text: &str) -> Vec<Cow<'_, str>> {
    untagged(parts_of(text, true))
}

fn untagged(parts: Vec<(Cow<'_, str>, bool)>) -> Vec<Cow<'_, str>> {
    parts.into_iter().map(|(part, _)| part).collect()
}

/// The parts [`kept_parts`] keeps (`named`) or [`salient_parts`] does, each with whether
/// it is one only for what it names.
fn parts_of(text: &str, named: bool) -> Vec<(Cow<'_, str>, bool)> {
    // Each sentence's part, and whether it is one only for what it names.
    let mut parts: Vec<(Cow<'_, str>, bool)> = Vec::new();
    let mut rules = false;
    for sentence in text.lines().flat_map(scan::sentences) {
        if scan::is_constraint(sentence) {
            rules = true;
            parts.push((Cow::Borrowed(sentence), false));
        } else if quantity::amount(sentence).is_some() {
            let clause = number_clause(sentence);
            let part = if clause.ends_with(['.', '!', '?']) {
                Cow::Borrowed(clause)
            } else {
                Cow::Owned(format!("{clause}."))
            };
            parts.push((part, false));
        } else if named && commitment::names_something(sentence) {
            parts.push((Cow::Borrowed(sentence), true));
        }
    }
    // A rule found says what the message forbids or asks: its other sentences are not.
    if rules {
        parts.retain(|(_, only_named)| !only_named);
    }
    parts
}

/// A user message this short is a word in passing (a person's interjection is a few
/// sentences): never one that names things everywhere.
const ASIDE_CHARS: usize = 600;

/// The clause of `sentence` (between `,`, `;` and `:`) that holds its number, when that
/// says enough on its own ("the nightly import handles 749540 rows"); else the sentence.
fn number_clause(sentence: &str) -> &str {
    const LEAST: usize = 16;
    sentence
        .split([',', ';', ':'])
        .map(|c| c.trim().trim_end_matches('.'))
        .find(|c| quantity::amount(c).is_some())
        .filter(|c| c.len() >= LEAST)
        .unwrap_or(sentence)
}

/// `text` in about `room` characters: the lines that state facts when it holds any (a
/// constraint, an error, a written file, a decision), else its ends when there is room for
/// a note of the cut, else its beginning.
fn cut_to(text: &str, room: usize) -> String {
    const NOTE: usize = 64;
    let facts = super::cut::facts_within(text, room.saturating_sub(8));
    if !facts.is_empty() {
        return format!("[...] {}", facts.join("\n"));
    }
    if room > 2 * NOTE {
        let keep = room - NOTE;
        keep_ends(text, keep * 2 / 3, keep / 3)
    } else {
        clip(text, room).to_string()
    }
}

/// One line on a turn just before the cut; `None` for one that holds only placeholders.
fn preview(
    m: &Message,
    text: &str,
    turns: &[Message],
    i: usize,
    index: &HashMap<String, CallInfo>,
) -> Option<String> {
    let line = one_line(text, LAST_TURN_CHARS);
    let out = match m.role {
        Role::Assistant if m.makes_calls() => {
            let calls: Vec<String> = m
                .tool_calls()
                .iter()
                .map(|c| {
                    call_id(c)
                        .and_then(|id| index.get(id))
                        .map_or_else(|| CallInfo::from_call(c).label(), CallInfo::label)
                })
                .collect();
            let calls = one_line(&calls.join("; "), LAST_TURN_CHARS);
            if line.is_empty() {
                format!("assistant called: {calls}")
            } else {
                format!("assistant: {line} (called: {calls})")
            }
        }
        _ if line.is_empty() => return None,
        Role::Tool | Role::Function => {
            let who = result_info(turns, i, index).map_or_else(|| "tool".into(), |c| c.name);
            format!("{who} result: {line}")
        }
        r => format!("{}: {line}", r.as_str()),
    };
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::message::parse_test_messages;
    use crate::engine::summary::wrap;
    use serde_json::{json, Value};

    #[test]
    fn a_long_ask_is_cut_with_its_secrets_masked_first() {
        let key = format!("sk-proj-{}", "A1b2C3d4".repeat(6));
        for before in (0..400).step_by(7) {
            let text = format!(
                "{}API_KEY {key} {}\nerror: build failed in src/net.rs\n{}",
                "word ".repeat(before / 5),
                "more ".repeat(60),
                "tail ".repeat(80),
            );
            let cut = cut_ask(&text, 120, 60);
            assert!(cut.contains("omitted by compaction"), "{cut}");
            for piece in key.as_bytes().windows(12) {
                let piece = std::str::from_utf8(piece).unwrap_or_default();
                assert!(!cut.contains(piece), "{before}: {cut}");
            }
        }
    }

    fn parse(v: Value) -> Vec<Message> {
        parse_test_messages(&v)
    }

    /// The requests section of a digest (empty when it has none).
    fn asks_of(d: &str) -> &str {
        d.split("\n\n")
            .find(|s| s.starts_with(Section::Asks.heading()))
            .unwrap_or_default()
    }

    /// Whether `text` stands in the digest as an item of its own.
    fn listed(d: &str, text: &str) -> bool {
        d.lines().any(|l| l == format!("- {text}"))
    }

    /// The digest of `turns` at the largest budget where it no longer holds `both`.
    fn first_giving_up(turns: &[Message], both: impl Fn(&str) -> bool) -> String {
        let whole = digest(None, turns, 10_000).len();
        (1..=whole)
            .rev()
            .map(|budget| digest(None, turns, budget))
            .find(|d| !both(d))
            .unwrap_or_default()
    }

    #[test]
    fn one_kind_of_fact_never_crowds_out_another() {
        // A decision said early, then a dozen files written: the same rank. Short of
        // room, the files give up their oldest before the one decision goes.
        let mut turns = vec![
            json!({"role": "user", "content": "Port the reports to the new schema."}),
            json!({"role": "assistant", "content": "Decision: reports_v2 keeps the old column names as views."}),
        ];
        for n in 0..12 {
            turns.push(
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{n}"),
                "type": "function", "function": {"name": "run", "arguments": "{}"}}]}),
            );
            turns.push(json!({"role": "tool", "tool_call_id": format!("c{n}"),
                "content": format!("Wrote src/reports/part_{n:02}.py")}));
        }
        turns.push(json!({"role": "user", "content": "thanks"}));
        let turns = parse(Value::Array(turns));
        let whole = digest(None, &turns, 10_000);
        assert!(whole.contains("written: src/reports/part_00.py"), "{whole}");
        let small = digest(None, &turns, whole.len() / 2);
        assert!(
            small.contains("reports_v2 keeps the old column names"),
            "{small}"
        );
        assert!(small.contains("written: src/reports/part_11.py"), "{small}");
        assert!(
            !small.contains("written: src/reports/part_00.py"),
            "{small}"
        );
    }

    #[test]
    fn a_path_another_item_names_is_the_first_line_given_up() {
        // The rule names the file it forbids: short of room, the file's own line goes
        // before anything that says something (the rule, the error, the calls made).
        let rule = "Never modify config/prod_q5.yaml; the ops team deploys it by hand.";
        let turns = parse(json!([
            {"role": "user", "content": format!("Fix the deploy script. {rule}")},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "r", "type": "function",
                "function": {"name": "read_file", "arguments": "{\"path\":\"config/prod_q5.yaml\"}"}}]},
            {"role": "tool", "tool_call_id": "r", "content": "replicas: 3"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "t", "type": "function",
                "function": {"name": "run", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "t", "content": "error: deploy.sh: line 14: kubectl_q5: command not found"},
            {"role": "user", "content": "go on"},
        ]));
        let whole = digest(None, &turns, 10_000);
        assert!(whole.contains("forbidden: config/prod_q5.yaml"), "{whole}");
        let d = first_giving_up(&turns, |d| d.contains("forbidden: config/prod_q5.yaml"));
        assert!(d.contains(rule), "{d}");
        assert!(d.contains("kubectl_q5: command not found"), "{d}");
        // A name inside a longer one is not that name.
        assert!(names_whole("edit app.py.", 5, 11));
        assert!(!names_whole("edit webapp.py", 8, 14));
        assert!(!names_whole("keep app.py.bak", 5, 11));
        // Before the log of the calls made, ranked below any path.
        let d = first_giving_up(&turns, |d| listed(d, "run"));
        assert!(!d.contains("config/prod_q5.yaml\n"), "{d}");
    }

    #[test]
    fn what_an_agent_says_through_a_tool_is_read_for_its_decisions() {
        let call = |id: &str, name: &str, args: serde_json::Value| {
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
                "function": {"name": name, "arguments": args.to_string()}}]})
        };
        let result = |id: &str| json!({"role": "tool", "tool_call_id": id, "content": "ok"});
        let turns = parse(json!([
            {"role": "user", "content": "Pick a store for the events and tell me."},
            call("c1", "send_message", json!({"message": "We'll go with Postgres for the event store; SQLite can't take the writes."})),
            result("c1"),
            call("c2", "final_answer", json!({"answer": "Decision: events_v2 replaces the old table."})),
            result("c2"),
            // A file's contents are no words of the agent's.
            call("c3", "write_file", json!({"path": "notes.md", "content": "Let's go with MongoDB."})),
            result("c3"),
            {"role": "user", "content": "thanks"},
        ]));
        let d = digest(None, &turns, 10_000);
        let decisions = d
            .split("## Decisions")
            .nth(1)
            .and_then(|s| s.split("\n\n").next())
            .unwrap_or("");
        assert!(
            decisions.contains("go with Postgres for the event store"),
            "{d}"
        );
        assert!(
            decisions.contains("events_v2 replaces the old table"),
            "{d}"
        );
        assert!(!decisions.contains("MongoDB"), "{d}");
    }

    #[test]
    fn a_persons_long_message_cut_keeps_what_it_names_over_its_chatter() {
        // One line of chatter with a rule in its middle, said in words no reading
        // knows, and a release that reads like a requirement ("nothing you need to").
        let text = "Morning! Quick context dump from the standup before you carry on with the \
            search, sorry it rambles a bit. We talked about the roadmap and the offsite and who \
            is on call next week, nothing you need to act on there. Priya says \
            deploy/values-prod.yaml belongs to the platform crew now. \
            Anyway, that is all from me for now, keep going with what you were doing and ping \
            me when you have something.";
        for budget in [600, 900, 1200] {
            let d = Digest::new(budget);
            let cut = cut_ask(text, d.ask_head, d.ask_tail);
            assert!(cut.len() < text.len(), "{budget}: {cut}");
            assert!(
                cut.contains("Priya says deploy/values-prod.yaml belongs to the platform crew"),
                "{budget}: {cut}"
            );
        }
    }

    #[test]
    fn turns_sent_as_json_are_read_by_their_words_and_lines() {
        // A MemGPT-style session: the user's turns are events, the runtime's heartbeat
        // among them, a person's message joined after it, and a tool's answer an object
        // whose message holds a traceback.
        let turns = parse(json!([
            {"role": "user", "content": "{\"type\": \"user_message\", \"message\": \"Never email the whole list; cap each send at 250 recipients.\", \"time\": \"10:00\"}"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "send_batch", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "{\"status\": \"Failed\", \"message\": \"Traceback (most recent call last):\\n  File \\\"mail.py\\\", line 3\\nsmtplib.SMTPDataError: (554, 'quota_k7 exceeded')\", \"time\": \"10:01\"}"},
            {"role": "user", "content": "{\"type\": \"heartbeat\", \"reason\": \"[automated] function failed, returning control\", \"time\": \"10:01\"}\n\nAlso, the audit id for this campaign is 88213407."},
            {"role": "assistant", "content": "ok"},
        ]));
        let d = digest(None, &turns, 10_000);
        let asks = asks_of(&d);
        assert!(asks.contains("cap each send at 250 recipients"), "{d}");
        assert!(
            !asks.contains("user_message") && !asks.contains("heartbeat"),
            "{d}"
        );
        assert!(asks.contains("88213407"), "{d}");
        // The exception's own line, not the object around it.
        assert!(
            d.lines()
                .any(|l| l.ends_with(": smtplib.SMTPDataError: (554, 'quota_k7 exceeded')")),
            "{d}"
        );
    }

    #[test]
    fn a_later_request_ranks_by_its_words_and_a_folded_task_as_the_goal() {
        // The first request of a middle is no goal for being the oldest listed: the task
        // stands before it, kept apart. Made to give up one item, the digest gives up a
        // remark before a choice of the agent's; folded in, the task outranks the choice.
        for (ask, choice) in [
            (
                "Also, the staging box was slow this morning.",
                "I'm routing every upload through `blob_gateway` now.",
            ),
            (
                "fyi the docs site moved to a new host",
                "The worker pool stays on `rayon` from here on.",
            ),
            (
                "Thanks, that output looks familiar.",
                "`serde_yaml` got swapped out for `toml_edit` in the loader.",
            ),
            (
                "The nightly job ran twice yesterday.",
                "Pinning `grpcio` to 1.62 for the whole service.",
            ),
        ] {
            let turns = parse(json!([
                {"role": "user", "content": ask},
                {"role": "assistant", "content": choice},
            ]));
            let item = |d: &str, text: &str| d.lines().any(|l| l == format!("- {text}"));
            // The largest budget at which the digest gives up one of the two.
            let whole = digest(None, &turns, 10_000).len();
            let first_given_up = |write: fn(Option<&str>, &[Message], usize) -> String| {
                (1..=whole)
                    .rev()
                    .map(|budget| write(None, &turns, budget))
                    .find(|d| !(item(d, ask) && item(d, choice)))
                    .unwrap()
            };
            let later = first_given_up(digest);
            assert!(item(&later, choice) && !item(&later, ask), "{later}");
            let task = first_given_up(|previous, turns, budget| {
                digest_in(previous, turns, budget, true, &Beside::default())
            });
            assert!(item(&task, ask) && !item(&task, choice), "{task}");
        }
    }

    /// Briefs that restate their role and rules before what is new, as agents that brief
    /// one another write them, in several wordings.
    const PREAMBLES: [&str; 4] = [
        "You are the reviewer of a small command-line tool. Your colleague writes the code \
         and you check it line by line. Answer in plain English and keep each reply short. \
         The customer wants a tool that converts CSV files to JSON. ",
        "ROLE: senior tester on the billing team.\nCONTEXT: the invoices service is \
         written in Go and deployed twice a week.\nRULE: do not change the public API of \
         the service.\n",
        "As the product owner you decide what ships in this sprint, and the team follows \
         your priorities. The app is a todo list with reminders for phones. We review the \
         board every morning at nine. ",
        "Dear assistant, we keep working on the weather dashboard for the city council. \
         The dashboard reads the sensors of forty stations. Every change goes through the \
         staging site first. ",
    ];

    #[test]
    fn a_sentence_another_brief_said_before_is_listed_once() {
        for preamble in PREAMBLES {
            let first = format!("{preamble}First, sketch the modules.");
            let news =
                "Next, rename the converter module to csv_two and update every import of it.";
            let filler: String = (0..6)
                .map(|i| format!("Point {i} of the plan lists one more step to take later. "))
                .collect();
            let second = format!("{preamble}{news} {filler}");
            let turns = parse(json!([
                {"role": "user", "content": first},
                {"role": "assistant", "content": "Here is a sketch of the modules."},
                {"role": "user", "content": second},
                {"role": "assistant", "content": "I will rename it now."},
            ]));
            // A quarter of this budget is less than the second brief: cut to its ends,
            // its news (after the preamble) would be lost had it kept the preamble again.
            let d = digest(None, &turns, 1_800);
            let asks = asks_of(&d);
            assert!(asks.contains(news), "{d}");
            for sentence in preamble.lines().flat_map(scan::sentences) {
                assert_eq!(asks.matches(sentence).count(), 1, "{sentence}: {d}");
            }
        }
    }

    #[test]
    fn a_sentence_the_request_keeps_whole_beside_the_digest_is_not_written_again() {
        for preamble in PREAMBLES {
            // Every brief restates the preamble, the latest one (kept whole) too.
            let first = format!("{preamble}First, sketch the modules.");
            let rule = "Never edit the generated schema in gen/schema_v2.json by hand.";
            let second = format!("{preamble}{rule}");
            let latest = format!("{preamble}Now write the tests for the converter.");
            let turns = parse(json!([
                {"role": "user", "content": first},
                {"role": "assistant", "content": "Here is a sketch of the modules."},
                {"role": "user", "content": second},
                {"role": "assistant", "content": "Understood."},
            ]));
            let kept = parse(json!([
                {"role": "system", "content": "You are a careful engineer."},
                {"role": "user", "content": latest},
            ]));
            let beside = Beside::of(&kept);
            let d = digest_in(None, &turns, 10_000, false, &beside);
            let asks = asks_of(&d);
            assert!(asks.contains(rule), "{d}");
            assert!(asks.contains("First, sketch the modules."), "{d}");
            for sentence in preamble.lines().flat_map(scan::sentences) {
                let said_beside = said_key(sentence).is_some();
                assert_eq!(asks.contains(sentence), !said_beside, "{sentence}: {d}");
            }
            // Without the latest brief beside it, the digest lists the preamble once.
            let alone = digest(None, &turns, 10_000);
            let sentence = preamble.lines().flat_map(scan::sentences).next().unwrap();
            assert_eq!(asks_of(&alone).matches(sentence).count(), 1, "{alone}");
        }
    }

    #[test]
    fn a_rule_said_again_is_given_up_as_late_as_its_last_saying() {
        // Two rules, the first said again after the second: listed once, under its first
        // saying, and as recent as its second, so when one of the two must go it is the
        // other, said longer ago.
        for (rule, other) in [
            (
                "Never push to the release branch, only open pull requests against it.",
                "Don't add new dependencies to requirements.txt, we are frozen.",
            ),
            (
                "Do not touch the vendored copy of the parser under third_party.",
                "You must keep the tests green on every commit you make.",
            ),
            (
                "Keep every response under 200 ms at the p99, whatever you change.",
                "Never log a customer's address, not even in debug builds.",
            ),
            (
                "Under no circumstances rename the public functions in api.py.",
                "Always ask before you delete a migration file.",
            ),
        ] {
            let turns = parse(json!([
                {"role": "user", "content": rule},
                {"role": "assistant", "content": "Understood, I will keep to that."},
                {"role": "user", "content": other},
                {"role": "assistant", "content": "Noted, that too."},
                {"role": "user", "content": format!("Please remember this. {rule}")},
                {"role": "assistant", "content": "Yes, I remember it."},
            ]));
            let whole = digest(None, &turns, 10_000);
            assert_eq!(asks_of(&whole).matches(rule).count(), 1, "{whole}");
            let given_up = first_giving_up(&turns, |d| listed(d, rule) && listed(d, other));
            assert!(listed(&given_up, rule), "{given_up}");
        }
    }

    #[test]
    fn a_long_brief_takes_a_quarter_of_the_digest_at_most() {
        // Another agent's brief or a pasted spec, then the short facts said after it: the
        // brief keeps its ends within a quarter of the budget (it took half before), and
        // the facts their room.
        for budget in [800, 1_600, 3_200] {
            let brief: String = (0..80)
                .map(|i| format!("Part {i} of the brief describes the inputs of stage {i}. "))
                .collect();
            let turns = parse(json!([
                {"role": "user", "content": brief},
                {"role": "assistant", "content": "Decision: we size the buffer with `BUF_CAP`."},
                {"role": "user", "content": "Keep the exports in io.h as they are."},
            ]));
            let d = digest(None, &turns, budget);
            let item = d.lines().find(|l| l.starts_with("- Part 0")).unwrap();
            assert!(
                item.len() <= budget / 4 + 40,
                "{budget}: {} {d}",
                item.len()
            );
            assert!(
                d.contains("Decision: we size the buffer with `BUF_CAP`."),
                "{d}"
            );
            assert!(d.contains("Keep the exports in io.h as they are."), "{d}");
        }
    }

    #[test]
    fn an_error_the_user_pastes_is_listed_once() {
        // Alone or after a request, the pasted failure is listed with the errors; the
        // request does not repeat it when it is cut to its salient parts.
        for (said, error) in [
            (
                "TypeError: unsupported operand type(s) for +: 'int' and 'str'",
                "TypeError: unsupported operand type(s) for +: 'int' and 'str'",
            ),
            (
                "now it says\nerror[E0599]: no method named `flush_all` found for struct `Sink`",
                "error[E0599]: no method named `flush_all` found for struct `Sink`",
            ),
            (
                "please fix the rest too, 3 files\nsqlalchemy.exc.OperationalError: no such table: users",
                "sqlalchemy.exc.OperationalError: no such table: users",
            ),
            (
                "FATAL: role \"svc_7\" does not exist.",
                "FATAL: role \"svc_7\" does not exist",
            ),
        ] {
            let turns = parse(json!([
                {"role": "user", "content": "Task: get the service running."},
                {"role": "assistant", "content": "Starting it now."},
                {"role": "user", "content": said},
            ]));
            for budget in [10_000, 200] {
                let d = digest(None, &turns, budget);
                // Items only: the previews of the last turns quote the message.
                let listed = d
                    .lines()
                    .filter(|l| !l.starts_with("- user: ") && l.contains(error))
                    .count();
                assert_eq!(listed, 1, "{budget}: {d}");
            }
        }
    }

    #[test]
    fn the_best_error_line_stands_first_among_lines_scored_as_high() {
        // Both lines score alike; the error list's pick is the first (the rest follow
        // from it), and it leads although the later line would win a tie of places.
        let text = "error: the first failure\nnoise\nerror: the second failure\n";
        let lines: Vec<String> = error_lines(text).into_iter().map(|(_, l)| l).collect();
        assert_eq!(
            lines,
            ["error: the first failure", "error: the second failure"]
        );
    }

    fn session() -> Vec<Message> {
        parse(json!([
            {"role": "user", "content": "Fix the failing build in src/net.rs"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"src/net.rs\"}"}},
                {"id": "b", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"cargo build\"}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "pub fn connect() {}"},
            {"role": "tool", "tool_call_id": "b", "content": "warning: unused\nerror[E0425]: cannot find value `addr`\nerror: could not compile `net`"},
            {"role": "assistant", "content": "The root cause is a missing variable; adding it."},
        ]))
    }

    #[test]
    fn shortened_to_items_a_digest_gives_up_whole_items_down_to_none() {
        let d = digest(None, &session(), 10_000);
        let items = |t: &str| -> Vec<String> {
            t.lines()
                .filter_map(|l| l.strip_prefix("- "))
                .map(str::to_string)
                .collect()
        };
        let all = items(&d);
        let mut seen = Vec::new();
        for budget in (0..d.len()).step_by(7) {
            let short = shorten_to_items(&d, budget);
            assert!(
                short.len() <= budget.max(1) || short.is_empty(),
                "{budget}: {short}"
            );
            for item in items(&short) {
                assert!(
                    all.contains(&item),
                    "{budget}: {item:?} is not an item of\n{d}"
                );
            }
            seen.push(items(&short).len());
        }
        assert!(shorten_to_items(&d, 10).is_empty());
        // [`shorten`] cuts the last item instead.
        assert!(!shorten(&d, 10).is_empty());
        assert!(seen.iter().any(|&n| n > 0 && n < all.len()), "{seen:?}");
    }

    #[test]
    fn lists_asks_decisions_calls_files_errors_and_last_turns() {
        let d = digest(None, &session(), 10_000);
        for needle in [
            "## User requests and constraints, oldest first\n- Fix the failing build in src/net.rs",
            "## Decisions and conclusions\n- The root cause is a missing variable; adding it.",
            "## Errors seen\n- bash command=cargo build: error[E0425]: cannot find value `addr`",
            "## Tool calls and commands, in order\n- read_file path=src/net.rs\n- bash command=cargo build\n",
            "## Files and paths seen\n- src/net.rs",
            "- assistant: The root cause is a missing variable; adding it.",
        ] {
            assert!(d.contains(needle), "missing {needle:?} in\n{d}");
        }
    }

    #[test]
    fn carried_forward_item_by_item_and_stable() {
        let first = digest(None, &session(), 10_000);
        let more =
            parse(json!([{"role": "user", "content": "Now add a test\nfor the\n  indented case"}]));
        let second = digest(Some(&first), &more, 10_000);
        assert!(
            second.contains("- Fix the failing build in src/net.rs\n- Now add a test\n  for the\n    indented case"),
            "{second}"
        );
        assert!(second.contains("- read_file path=src/net.rs"));
        assert!(!second.contains(H_EARLIER), "merged, not nested:\n{second}");
        assert_eq!(digest(Some(&second), &[], 10_000), second);
        // Old headings are read as the sections they became.
        let old = "## User requests, oldest first\n- ship it\n\n## Tool calls made\n- bash command=ls (x3)\n\n## Files touched\n- a.rs";
        let read = digest(Some(old), &[], 10_000);
        assert_eq!(
            read,
            "## User requests and constraints, oldest first\n- ship it\n\n## Tool calls and commands, in order\n- bash command=ls (x3)\n\n## Files and paths seen\n- a.rs"
        );
    }

    #[test]
    fn foreign_summaries_are_carried_and_the_budget_holds() {
        let d = digest(Some("## Active Task\nship it"), &session(), 10_000);
        assert!(
            d.starts_with("## Earlier summary\n### Active Task\nship it"),
            "{d}"
        );
        for budget in [60, 200, 400, 800] {
            let tiny = digest(None, &session(), budget);
            assert!(tiny.len() <= budget, "{} chars:\n{tiny}", tiny.len());
            assert!(!tiny.is_empty());
        }
        let small = digest(None, &session(), 300);
        assert!(small.contains("Fix the failing build"), "{small}");
    }

    #[test]
    fn identical_consecutive_calls_collapse_in_order() {
        let call = |id: &str, cmd: &str| {
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": id, "type": "function", "function": {"name": "bash", "arguments": json!({"command": cmd}).to_string()}}]})
        };
        let result = |id: &str| json!({"role": "tool", "tool_call_id": id, "content": "ok"});
        let turns = parse(json!([
            {"role": "user", "content": "go"},
            call("1", "make"), result("1"), call("2", "make"), result("2"), call("3", "make"), result("3"),
            call("4", "ls"), result("4"), call("5", "make"), result("5"),
        ]));
        let d = digest(None, &turns, 10_000);
        assert!(
            d.contains("- bash command=make (x3)\n- bash command=ls\n- bash command=make\n"),
            "{d}"
        );
        // Carried forward, the next identical call adds to the count.
        let next = parse(json!([call("6", "make"), result("6")]));
        let again = digest(Some(&d), &next, 10_000);
        assert!(
            again.contains("- bash command=ls\n- bash command=make (x2)\n"),
            "{again}"
        );
    }

    #[test]
    fn an_error_is_listed_once_however_often_it_recurs() {
        let d = digest(None, &session(), 10_000);
        let again = parse(json!([
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"cargo check\"}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "error[E0425]: cannot find value `addr`"},
        ]));
        let next = digest(Some(&d), &again, 10_000);
        let errors = next
            .split("\n\n")
            .find(|s| s.starts_with(Section::Errors.heading()))
            .unwrap();
        assert_eq!(
            errors.matches("cannot find value `addr`").count(),
            1,
            "{next}"
        );
        assert!(next.contains("- bash command=cargo check\n"), "{next}");
    }

    #[test]
    fn placeholders_are_not_history() {
        let turns = parse(json!([
            {"role": "user", "content": OPENING},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"make\"}"}},
                {"id": "b", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "[output of bash command=make pruned by compaction: 20 lines; first error: error: linker failed]"},
            {"role": "tool", "tool_call_id": "b", "content": STUB.trim()},
            {"role": "user", "content": [{"type": "text", "text": "[earlier image removed by context compaction]"}, {"type": "text", "text": "what now?"}]},
        ]));
        let d = digest(None, &turns, 10_000);
        assert!(
            d.contains("- bash command=make: error: linker failed"),
            "{d}"
        );
        assert!(d.contains("- what now?"), "{d}");
        for placeholder in [
            OPENING,
            "pruned by compaction",
            "no longer available",
            "removed by context",
        ] {
            assert!(!d.contains(placeholder), "{placeholder:?} in\n{d}");
        }
    }

    #[test]
    fn never_empty_when_it_replaces_something() {
        let turns = parse(json!([
            {"role": "user", "content": OPENING},
            {"role": "assistant", "content": ""},
        ]));
        let d = digest(None, &turns, 1000);
        assert!(d.contains("2 messages with nothing to list"), "{d}");
        assert_eq!(digest(None, &[], 1000), "");
    }

    #[test]
    fn a_folded_summary_is_carried_not_quoted() {
        let first = digest(None, &session(), 10_000);
        let turns = parse(json!([
            {"role": "user", "content": format!("{}\n\nand keep going", wrap(&first))},
        ]));
        let d = digest(None, &turns, 10_000);
        assert!(!d.contains(crate::engine::MARKER), "{d}");
        assert!(
            d.contains("- Fix the failing build in src/net.rs\n- and keep going"),
            "{d}"
        );
    }

    #[test]
    fn secrets_are_masked() {
        let turns = parse(json!([
            {"role": "user", "content": "use OPENAI_API_KEY=sk-proj-Abcdefghijklmnop1234567890 for the test"},
        ]));
        let d = digest(None, &turns, 10_000);
        assert!(!d.contains("Abcdefghijklmnop"), "{d}");
        assert!(d.contains("[REDACTED"), "{d}");
    }

    #[test]
    fn a_carried_llm_checkpoint_keeps_its_facts_when_cut() {
        let filler: String = (0..60)
            .map(|i| format!("- Completed step {i} of the migration plan as agreed.\n"))
            .collect();
        let llm = format!(
            "## Active Task\nship it\n\n## Completed Actions\n{filler}- FAILED tests/test_ledger.py::test_round - AssertionError: 10.05 != 10.04\n{filler}\n## Relevant Files\n- src/ledger.rs"
        );
        for budget in [600, 1200] {
            let d = digest(Some(&llm), &session(), budget);
            assert!(
                d.contains("FAILED tests/test_ledger.py::test_round"),
                "{budget}: {d}"
            );
            let short = shorten(&llm, budget);
            assert!(
                short.contains("FAILED tests/test_ledger.py::test_round"),
                "{short}"
            );
            assert!(short.len() <= budget + 64, "{}", short.len());
        }
    }

    #[test]
    fn a_written_file_keeps_its_rank_when_the_digest_is_read_back() {
        let turns = parse(json!([
            {"role": "user", "content": "Profile the importer"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"make profile\"}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "done\nWrote artifacts/run_7/profile.svg"},
            {"role": "assistant", "content": "Let's make the next change now. Let's read it again. Let's look at it once more."},
        ]));
        let first = digest(None, &turns, 10_000);
        assert!(
            first.contains("- written: artifacts/run_7/profile.svg\n"),
            "{first}"
        );
        // Shortened, the written file outranks the narration, as it did in the first
        // digest; read back as a plain path it would have gone first.
        let short = shorten(&first, 200);
        assert!(short.len() <= 200, "{short}");
        assert!(
            short.contains("- written: artifacts/run_7/profile.svg"),
            "{short}"
        );
        assert!(!short.contains("Let's look"), "{short}");
        // Read back again it is the same item, not a second one.
        let again = digest(Some(&first), &turns, 10_000);
        assert_eq!(
            again
                .matches("- written: artifacts/run_7/profile.svg\n")
                .count(),
            1,
            "{again}"
        );
        assert!(!again.contains("\n- artifacts/run_7"), "{again}");
    }

    #[test]
    fn an_error_names_its_call_briefly() {
        let long = "x".repeat(300);
        let turns = parse(json!([
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "bash", "arguments": json!({"command": format!("python -c '{long}'")}).to_string()}}]},
            {"role": "tool", "tool_call_id": "a", "content": "KeyError: 'tenant_9'"},
        ]));
        let d = digest(None, &turns, 10_000);
        let line = d
            .lines()
            .find(|l| l.contains("KeyError: 'tenant_9'"))
            .unwrap_or_default();
        assert!(line.len() <= 80, "{line}");
    }

    #[test]
    fn a_small_digest_lists_an_error_without_its_call_and_once() {
        let turns = parse(json!([
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"npm run build:ssr\"}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "npm ERR! Missing script: \"build:ssr-jn79\""},
        ]));
        let d = digest(None, &turns, 300);
        assert!(
            d.contains("\n- npm ERR! Missing script: \"build:ssr-jn79\"\n"),
            "{d}"
        );
        // Met again in the next stretch, it is the same error, not a second line.
        let next = digest(Some(&d), &turns, 300);
        let line = "- npm ERR! Missing script: \"build:ssr-jn79\"";
        assert_eq!(next.lines().filter(|l| *l == line).count(), 1, "{next}");
    }

    #[test]
    fn room_left_by_a_larger_item_takes_back_a_smaller_one_dropped_before_it() {
        let small = "- Decision: we keep the cache_q7 layer.\n";
        let long = "- Let's go with a per-tenant rate bucket named bucket_df65, which keeps one noisy tenant from starving the rest.\n";
        let whole = format!(
            "Requests:\n- Never modify config/prod_xk83.yaml.\nDecisions:\n{small}{long}Errors:\n- KeyError: 'tenant_mp39'"
        );
        // Over by a little more than the small decision, the oldest fact: dropping it is
        // not enough, dropping the long one after it is, with room for the small one.
        let budget = whole.len() - small.len() - 4;
        let d = shorten(&whole, budget);
        assert!(d.len() <= budget, "{d}");
        assert!(d.contains(small), "{d}");
        assert!(!d.contains("bucket_df65"), "{d}");
        assert!(d.contains("KeyError: 'tenant_mp39'"), "{d}");
    }

    #[test]
    fn a_rule_keeps_its_numbers_in_their_clause_and_drops_the_rest() {
        let ask = "GITHUB_TOKEN=[REDACTED:token]\nQuick note before you go on. Never push to the release/zb62 branch, only open pull requests against it. For context: the nightly import handles 749540 rows, so anything quadratic will time out. Our quota is 120000 calls. Carry on.";
        assert_eq!(
            rules_and_numbers(ask),
            "Never push to the release/zb62 branch, only open pull requests against it. the nightly import handles 749540 rows. Our quota is 120000 calls."
        );
        assert_eq!(rules_and_numbers("Thanks, carry on."), "");
        // Too short a clause says too little: the sentence stays.
        assert_eq!(
            number_clause("Set it to 4096, please."),
            "Set it to 4096, please."
        );
    }

    #[test]
    fn a_rule_gives_up_its_small_talk_before_a_fact_is_dropped() {
        let turns = parse(json!([
            {"role": "user", "content": "Quick note before you go on, I had a long day and my lunch was late again today. Never push to the release/zb62 branch, only open pull requests against it. For context: the nightly import handles 749540 rows, so anything quadratic will time out. Carry on, thanks a lot."},
            {"role": "assistant", "content": "Decision: we keep the existing cache and drop the prefetch_q7 layer."},
        ]));
        // Room for the rule and the decision, not for the whole message beside it.
        let budget = 280;
        let d = digest(None, &turns, budget);
        assert!(d.len() <= budget, "{d}");
        for fact in [
            "Never push to the release/zb62 branch, only open pull requests against it.",
            "the nightly import handles 749540 rows",
            "Decision: we keep the existing cache and drop the prefetch_q7 layer.",
        ] {
            assert!(d.contains(fact), "{fact:?} missing in\n{d}");
        }
        assert!(!d.contains("Quick note"), "{d}");
    }

    #[test]
    fn a_message_stating_a_number_keeps_what_it_names_when_it_gives_up_its_small_talk() {
        // Rules in wordings no reading takes as one still name what they are about; cut
        // to its rules and numbers, the message kept the number and lost them.
        for said in [
            "Customers still call the v1 endpoints in api/routes_v1.py every day.",
            "The colour tokens in ui/theme_k4.ts come from the brand team's design file.",
            "The rounding in money/round_c4.go was signed off by the auditors last week.",
            "Whatever else happens, payments_v3 keeps its current wire format.",
        ] {
            assert!(!scan::is_constraint(said), "{said}: read as a rule already");
            let turns = parse(json!([
                {"role": "user", "content": format!(
                    "Quick note before you go on, I had a long day and my lunch was late \
                     again. {said} The nightly import handles 749540 rows. Carry on, thanks \
                     a lot, and have a good evening.")},
                {"role": "assistant", "content": "Decision: we keep the existing cache and drop the prefetch_q7 layer."},
            ]));
            // A message may take a quarter of these budgets: cut to its ends, it keeps
            // its rules, numbers and what it names. At the smaller, what it names is more
            // than a quarter: a word in passing keeps it still, where a long message
            // naming things everywhere would keep its rules and numbers alone.
            for budget in [600, 300] {
                let d = digest(None, &turns, budget);
                assert!(d.len() <= budget, "{d}");
                for fact in [said, "749540", "prefetch_q7"] {
                    assert!(d.contains(fact), "{fact:?} missing in\n{d}");
                }
                // The request gave up its small talk (the previews of the last turns
                // quote it).
                assert!(!d.lines().any(|l| l.starts_with("- Quick note")), "{d}");
            }
        }
    }

    #[test]
    fn an_older_plain_request_goes_before_what_a_message_stating_a_number_names() {
        // What the user said once beside a number (a rule in a wording no reading takes
        // as one, naming the file it is about) outlives a request a later turn has moved
        // past; the two newest requests stay either way.
        let said = "Customers still call the v1 endpoints in api/routes_v1.py every day.";
        let turns = parse(json!([
            {"role": "user", "content": "Can you tidy up the headings of the guide first?"},
            {"role": "assistant", "content": "Done, the headings are consistent now."},
            {"role": "user", "content": format!(
                "Quick note before you go on. {said} The nightly import handles 749540 rows.")},
            {"role": "assistant", "content": "Noted, I will keep that in mind."},
            {"role": "user", "content": "Now add a changelog entry for the release."},
            {"role": "assistant", "content": "The entry is added under the next release."},
            {"role": "user", "content": "And bump the version in the manifest."},
            {"role": "assistant", "content": "The version in the manifest is bumped now."},
        ]));
        let whole = digest(None, &turns, usize::MAX);
        let budget = (300..whole.len())
            .find(|&b| digest(None, &turns, b).contains("tidy up the headings"))
            .expect("a budget that keeps every request");
        // A little less room than every request and the message's named sentence take.
        let d = digest(None, &turns, budget - 10);
        for kept in [said, "749540", "changelog entry", "bump the version"] {
            assert!(d.contains(kept), "{kept:?} missing in\n{d}");
        }
        assert!(!d.contains("tidy up the headings"), "{d}");
    }

    #[test]
    fn steps_announced_go_before_a_choice_said_as_one() {
        // The choice is the oldest decision: by age alone it went first.
        let choice = "Decision: we keep the ledger_q4 table as the source of truth.";
        let steps = [
            "I'll move the parser into src/parse_q1.rs.",
            "I'll rename the config loader to load_q2().",
            "I'll replace the retry loop in net_q3.rs with backoff().",
        ];
        let mut msgs = vec![
            json!({"role": "user", "content": "Tidy up the billing module."}),
            json!({"role": "assistant", "content": choice}),
        ];
        for step in steps {
            msgs.push(json!({"role": "user", "content": "Go on with the next part please."}));
            msgs.push(json!({"role": "assistant", "content": step}));
        }
        let turns = parse(Value::Array(msgs));
        for step in steps {
            assert_eq!(decision(step), Decision::Step, "{step}");
        }
        assert_eq!(decision(choice), Decision::Phrased);
        // The largest digest with room for all but one decision.
        let kept = |d: &str| {
            steps
                .iter()
                .chain([&choice])
                .filter(|s| d.contains(*s))
                .count()
        };
        let whole = digest(None, &turns, usize::MAX);
        let d = (100..whole.len())
            .rev()
            .map(|budget| digest(None, &turns, budget))
            .find(|d| kept(d) == 3)
            .expect("a budget that gives up one decision");
        assert!(d.contains(choice), "{d}");
        assert!(!d.contains(steps[0]), "{d}");
    }

    #[test]
    fn a_small_digest_has_short_headings_and_reads_back_with_its_items() {
        let items = |d: &str| -> Vec<String> {
            d.lines()
                .filter(|l| !l.starts_with("## "))
                .map(str::to_string)
                .collect()
        };
        let headings = |d: &str| -> Vec<String> {
            d.lines()
                .filter(|l| l.starts_with("## "))
                .map(str::to_string)
                .collect()
        };
        let small = digest(None, &session(), TIGHT_BELOW);
        let long: Vec<&str> = SECTIONS.iter().map(|s| s.heading()).collect();
        let short: Vec<&str> = SECTIONS.iter().map(|s| s.short_heading()).collect();
        assert!(headings(&small).len() > 1, "{small}");
        assert!(
            headings(&small).iter().all(|h| short.contains(&h.as_str())),
            "{small}"
        );
        // Read back with room to spare, the same items come under the long headings.
        let again = shorten(&small, 10_000);
        assert!(
            headings(&again).iter().all(|h| long.contains(&h.as_str())),
            "{again}"
        );
        assert_eq!(items(&again), items(&small));
    }

    #[test]
    fn a_decision_read_from_its_structure_ranks_above_the_asks_below_the_facts() {
        for structural in [
            "Keeping `tower::limit` as the only throttle in the gateway.",
            "`deadpool_postgres` will own every database connection from here.",
            "`rustls` is the safest option for the TLS layer.",
            "`blake3` over sha256 for the content hashes.",
        ] {
            assert_eq!(tier_of(decision(structural)), Tier::Choice, "{structural}");
        }
        // The wordings the phrases know keep their rank.
        assert_eq!(
            tier_of(decision("We settled on zstd_v3 for the archives.")),
            Tier::Fact
        );
        assert_eq!(
            tier_of(decision("I'll replace the retry loop with `backoff_v2`.")),
            Tier::Fact
        );
    }

    #[test]
    fn in_a_small_digest_a_structural_decision_gives_way_to_the_facts_not_to_the_asks() {
        let turns = parse(json!([
            {"role": "user", "content": "Never modify vendor/zlib_k41/. The export holds 88213 rows."},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"make export\"}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "ValueError: bad header in part_j2\nReport written to out/export_q8.xml"},
            {"role": "user", "content": "Please also tidy the code up a little while you are at it."},
            {"role": "assistant", "content": "Batching the rows through `csv_chunker_m5` for the whole export.\n`orjson_w7` will handle every payload we write."},
        ]));
        let facts = [
            "Never modify vendor/zlib_k41/.",
            "88213",
            "ValueError: bad header in part_j2",
            "out/export_q8.xml",
        ];
        let full = digest(None, &turns, 10_000);
        assert!(full.contains("orjson_w7"), "{full}");
        // Room for the facts and the decisions, not the plain ask as well: it goes.
        let d = digest(None, &turns, 300);
        for fact in facts.iter().chain(&["csv_chunker_m5", "orjson_w7"]) {
            assert!(d.contains(fact), "{fact:?} missing in\n{d}");
        }
        assert!(!d.contains("tidy the code"), "{d}");
        // Room for the facts alone: the structural decisions go, every fact stays.
        let tight = digest(None, &turns, 180);
        for fact in facts {
            assert!(tight.contains(fact), "{fact:?} missing in\n{tight}");
        }
        assert!(!tight.contains("orjson_w7"), "{tight}");
    }

    #[test]
    fn a_step_announced_that_names_nothing_ranks_below_the_facts() {
        // The next turns say it again in their own words; a named function or file
        // cannot be guessed.
        assert_eq!(
            tier_of(decision(
                "I will suggest the necessary changes to add the bounce animation."
            )),
            Tier::Seen
        );
        for named in [
            "I'll replace the hand-written retry loop with backoff() instead.",
            "I will move the settings into config.yaml for the next release.",
            "I will rename the class to ContextCompressor everywhere.",
            "I will cap the batch at 500 rows per request.",
        ] {
            assert_eq!(tier_of(decision(named)), Tier::Fact, "{named}");
        }
    }

    #[test]
    fn a_long_decision_gives_up_its_end_before_a_fact_is_dropped() {
        // One sentence, as agents write them: the statement, then the reasons run on.
        let long = "Decision: we move the importer to streaming reads, because it holds the \
            whole file in memory today, which is why the nightly run dies at the memory limit \
            on the smaller runners and why the retries pile up behind it every night.";
        let turns = parse(json!([
            {"role": "assistant", "content": long},
            {"role": "user", "content": "ok"},
            {"role": "assistant", "content": "We will store timestamps as UTC in events_q1 from now on."},
        ]));
        // Room for both with the long one cut to its statement, not whole.
        let budget = 280;
        let d = digest(None, &turns, budget);
        assert!(d.len() <= budget, "{d}");
        assert!(
            d.contains("Decision: we move the importer to streaming reads, because"),
            "{d}"
        );
        assert!(
            d.contains("We will store timestamps as UTC in events_q1 from now on."),
            "{d}"
        );
    }

    #[test]
    fn a_path_the_user_forbade_is_never_listed_as_written() {
        let forbid = [
            "Never modify deploy/values_prod.yaml, it is generated by the release job.",
            "Leave deploy/values_prod.yaml alone; the report builder writes it.",
            "You can change the chart, but don't touch deploy/values_prod.yaml (saved by ops).",
            "Please keep deploy/values_prod.yaml unchanged, it's exported nightly.",
        ];
        for rule in forbid {
            // The rule before a tool's line that reports writing the path, and after it.
            let wrote = json!({"role": "tool", "tool_call_id": "a", "content": "Report written to deploy/values_prod.yaml"});
            let call = json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"make report\"}"}}]});
            let user = json!({"role": "user", "content": rule});
            for turns in [
                parse(json!([user, call, wrote])),
                parse(json!([call, wrote, user])),
            ] {
                for budget in [10_000, 400] {
                    let d = digest(None, &turns, budget);
                    assert!(
                        !d.contains("written: deploy/values_prod.yaml"),
                        "{rule}\n{d}"
                    );
                    let again = shorten(&d, budget / 2);
                    assert!(!again.contains("written: deploy/"), "{rule}\n{again}");
                }
                let d = digest(None, &turns, 10_000);
                assert!(
                    d.contains("- forbidden: deploy/values_prod.yaml\n"),
                    "{rule}\n{d}"
                );
                // Read back, it is still forbidden.
                let next = digest(Some(&d), &turns[..1], 10_000);
                assert!(
                    next.contains("- forbidden: deploy/values_prod.yaml\n"),
                    "{next}"
                );
            }
        }
        // A person's words write nothing; a tool's output still does.
        let turns = parse(json!([
            {"role": "user", "content": "Could you compare it with the coverage report I saved in out/cov_q3.xml?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"pytest --cov\"}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "Coverage XML written to file out/cov_q4.xml"},
        ]));
        let d = digest(None, &turns, 10_000);
        assert!(!d.contains("written: out/cov_q3.xml"), "{d}");
        assert!(d.contains("- written: out/cov_q4.xml\n"), "{d}");
    }

    #[test]
    fn an_output_handed_back_is_told_from_a_persons_words_by_what_came_before() {
        let m = |role: &str, text: &str| parse(json!([{"role": role, "content": text}])).remove(0);
        let log = "============ test session starts ============\ncollected 3 items\n\n\
                   tests/test_io.py ..F [100%]\nE   KeyError: 'tenant'";
        let block = m(
            "assistant",
            "Let me run them.\n\n```bash\npytest tests/\n```",
        );
        let typed = m(
            "user",
            "Applied edit to tests/test_io.py\n\n/run pytest tests/",
        );
        let chat = m("assistant", "The parser now reads both formats.");
        // After a command the assistant gave or the user had run.
        assert!(hands_back_output(Some(&block), &m("user", log)));
        assert!(hands_back_output(Some(&typed), &m("user", log)));
        // Framed as an observation, after anything.
        let framed = format!("OBSERVATION:\n{log}");
        assert!(hands_back_output(Some(&chat), &m("user", &framed)));
        assert!(hands_back_output(None, &m("user", &framed)));
        // A person's words, after the same commands; a log pasted after no command; an
        // output with a person's words added after it.
        let words = "It still fails on my machine; please keep the fix inside the parser.";
        assert!(!hands_back_output(Some(&block), &m("user", words)));
        assert!(!hands_back_output(Some(&typed), &m("user", words)));
        assert!(!hands_back_output(Some(&chat), &m("user", log)));
        let added = format!("{framed}\n\nAlso, never touch vendor/ while you are at it.");
        assert!(!hands_back_output(Some(&block), &m("user", &added)));
        assert!(!hands_back_output(Some(&block), &m("assistant", log)));
    }

    #[test]
    fn what_a_command_the_user_typed_printed_is_an_output_not_a_request() {
        for typed in [
            "/run pytest tests/",
            "/test pytest tests/",
            "$ pytest tests/",
            "!pytest tests/",
        ] {
            let turns = parse(json!([
                {"role": "user", "content": "Add a test for the tenant lookup."},
                {"role": "assistant", "content": "Added `test_lookup` to tests/test_io.py."},
                {"role": "user", "content": typed},
                {"role": "user", "content": "======== test session starts ========\ncollected 3 items\n\n\
                    tests/test_io.py ..F [100%]\n\
                    E   KeyError: 'tenant_7'\n1 failed, 2 passed in 0.31s"},
            ]));
            let d = digest(None, &turns, 10_000);
            assert!(d.contains("KeyError: 'tenant_7'"), "{typed}\n{d}");
            assert!(!asks_of(&d).contains("collected 3 items"), "{typed}\n{d}");
        }
    }

    #[test]
    fn a_person_among_a_text_agents_observations_is_heard() {
        let interjections = [
            (
                "Also, keep the retry budget under 30 per minute.",
                "under 30 per minute",
            ),
            (
                "btw we can't exceed 2 GiB of memory on the runner",
                "exceed 2 GiB",
            ),
            (
                "Quick note: the sandbox allows at most 4 parallel jobs.",
                "at most 4 parallel",
            ),
            (
                "Remember the nightly batch is about 80k rows, plan for that.",
                "80k rows",
            ),
        ];
        for (said, number) in interjections {
            let observation = format!(
                "OBSERVATION:\n{}test result: ok. 4 passed",
                "Compiling net v0.1.0\n".repeat(30)
            );
            let turns = parse(json!([
                {"role": "user", "content": "Fix the flaky retry test."},
                {"role": "assistant", "content": "Let me run the tests.\n```bash\ncargo test\n```"},
                // An observation and the person's words after it, joined as one message.
                {"role": "user", "content": format!("{observation}\n\n{said}")},
                {"role": "assistant", "content": "Let me look at the backoff.\n```bash\ncat src/backoff.rs\n```"},
                // Raw output answering the command, no framing.
                {"role": "user", "content": "pub fn backoff(n: u32) -> u64 {\n    2u64.pow(n)\n}"},
            ]));
            let d = digest(None, &turns, 10_000);
            let asks = asks_of(&d);
            assert!(asks.contains(said), "{said}\n{d}");
            assert!(!asks.contains("OBSERVATION"), "{d}");
            assert!(!asks.contains("pub fn backoff"), "{d}");
            // In a digest of a few lines, the person's limit outlasts the rest.
            let small = digest(None, &turns, 200);
            assert!(small.contains(number), "{said}\n{small}");
        }
    }

    #[test]
    fn a_file_an_output_reports_making_ranks_as_written_never_a_forbidden_one() {
        for (line, path) in [
            (
                "benchmark summary stored at perf/summary_q4.md",
                "perf/summary_q4.md",
            ),
            ("Bundle: public/app.min_q2.js", "public/app.min_q2.js"),
            ("rendered diagram => docs/arch_q9.png", "docs/arch_q9.png"),
            (
                "Generated migrations/0007_q1_add_index.sql",
                "migrations/0007_q1_add_index.sql",
            ),
        ] {
            let output = format!("{}{line}\ndone in 4.1s", "step ok\n".repeat(40));
            let turns = parse(json!([
                {"role": "user", "content": "Run the release script. Never modify config/locked_q3.toml."},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"./release.sh\"}"}}]},
                {"role": "tool", "tool_call_id": "a", "content": output},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "b", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"./render.sh\"}"}}]},
                {"role": "tool", "tool_call_id": "b", "content": "config written to config/locked_q3.toml"},
            ]));
            let d = digest(None, &turns, 10_000);
            assert!(d.contains(&format!("- written: {path}\n")), "{line}\n{d}");
            assert!(!d.contains("written: config/locked_q3.toml"), "{d}");
            assert!(d.contains("forbidden: config/locked_q3.toml"), "{d}");
        }
    }

    #[test]
    fn a_code_agent_gets_what_its_programs_printed_as_outputs_not_requests() {
        // Agents that act in code their runtime runs, tool calls beside them or not: what
        // comes back in the user's turn is the run's, in prose or not; a person's words
        // among them are a request.
        let programs = [
            (
                "# look the figure up first\nhits = web_search(query=\"tallest dam in Norway\")\nprint(hits)",
                "Execution logs:\nThe tallest dam in Norway is Oddatjorn at 142 metres.\nLast output from code snippet:\nNone",
            ),
            (
                "for name in os.listdir(\"data\"):\n    print(name, os.path.getsize(\"data/\" + name))",
                "rides_2023.csv 48211\nstations.json 1920",
            ),
            (
                "const rows = await db.query(\"SELECT count(*) FROM trips\");\nconsole.log(rows);",
                "There are 18734 trips in the table.",
            ),
            (
                "df = pd.read_csv(\"data/rides_2023.csv\")\ndf.groupby(\"station\").size().head()",
                "Traceback (most recent call last):\n  File \"<stdin>\", line 1, in <module>\nKeyError: 'station'",
            ),
        ];
        let words = "Please keep the final answer in kilometres, the report uses those.";
        let mut messages =
            vec![json!({"role": "user", "content": "Find how long the ride data covers."})];
        for (i, (code, printed)) in programs.iter().enumerate() {
            messages.push(json!({"role": "assistant", "content": code}));
            messages.push(json!({"role": "user", "content": printed}));
            if i == 1 {
                messages.push(json!({"role": "user", "content": words}));
            }
        }
        // A tool call beside the programs does not make their runs requests.
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "final_answer", "arguments": "{}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": "c1", "content": "done"}));
        let d = digest(None, &parse(Value::Array(messages)), 10_000);
        let asks = asks_of(&d);
        assert!(asks.contains(words), "{d}");
        for printed in [
            "Oddatjorn",
            "rides_2023.csv 48211",
            "18734 trips",
            "Traceback",
        ] {
            assert!(!asks.contains(printed), "{printed}\n{d}");
        }
        assert!(d.contains("KeyError: 'station'"), "{d}");
        assert!(d.contains("code: "), "{d}");
        // One program in a chat makes no code agent of it: the answer after it is words.
        let chat = parse(json!([
            {"role": "user", "content": "How do I print the first rows of a frame?"},
            {"role": "assistant", "content": "df.head()"},
            {"role": "user", "content": "that works now"},
        ]));
        let d = digest(None, &chat, 10_000);
        assert!(d.contains("- that works now"), "{d}");
    }

    #[test]
    fn material_handed_over_without_a_word_gives_way_to_a_decision() {
        // A user turn with no line of prose (a listing, a table, a log pasted raw) holds
        // numbers, but says nothing the user asks: it goes before what the agent decided,
        // though said later.
        for (raw, decision) in [
            (
                "48211  data/rides_2023.csv\n1920   data/stations.json",
                "I'll load the rides with pyarrow instead of the csv module.",
            ),
            (
                "id | station | rides\n---|---|---\n17 | harbour | 3302\n18 | museum | 2990",
                "We will group the rides by station before joining them.",
            ),
            (
                "  PID USER      %CPU COMMAND\n 8123 app       97.2 worker\n 8130 app        0.3 nginx",
                "Decision: the worker gets a CPU quota of two cores.",
            ),
            (
                "2026-03-01T10:00:02Z GET /api/trips 200 31ms\n2026-03-01T10:00:03Z GET /api/trips 503 2ms",
                "The root cause is the connection pool running dry under load.",
            ),
        ] {
            let turns = parse(json!([
                {"role": "user", "content": "Look at the ride data for March."},
                {"role": "assistant", "content": decision},
                {"role": "user", "content": raw},
            ]));
            let first_line = raw.lines().next().unwrap_or_default();
            let given_up =
                first_giving_up(&turns, |d| listed(d, decision) && d.contains(first_line));
            assert!(listed(&given_up, decision), "{given_up}");
        }
    }

    #[test]
    fn a_brief_gives_up_its_general_rules_before_a_fact() {
        // Another agent's brief sets rules by the handful; the one naming what the model
        // could not guess stays with the facts said after it, the general ones go first.
        let general = [
            "You must write complete code with no placeholders.",
            "Always explain your reasoning before you answer.",
            "Never leave a function unimplemented.",
            "Make sure that every reply follows the format above.",
            "Do not ask the user questions, decide on your own.",
        ];
        for named in [
            "Never edit deploy/values_prod.yaml, it is applied by hand.",
            "Do not change the signature of `parse_invoice()`.",
            "Keep the bundle under 250 KB after minification.",
            "You must not push to the release/2026-q4 branch.",
        ] {
            let brief = format!(
                "{} {named} {}",
                general[..3].join(" "),
                general[3..].join(" ")
            );
            let decision = "I'll keep the cache in Redis rather than in the process.";
            let error = "TypeError: Cannot read properties of undefined (reading 'total')";
            let turns = parse(json!([
                {"role": "user", "content": brief},
                {"role": "assistant", "content": decision, "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "t1", "content": error},
            ]));
            let fits = |d: &str| d.contains(named) && d.contains(decision) && d.contains(error);
            let whole = digest(None, &turns, 10_000);
            assert!(fits(&whole), "{whole}");
            // The smallest budget that still keeps all three: no general rule is left.
            let tight = (1..=whole.len())
                .map(|budget| digest(None, &turns, budget))
                .find(|d| fits(d))
                .unwrap();
            for rule in general {
                assert!(!tight.contains(rule), "{rule}\n{tight}");
            }
        }
    }

    #[test]
    fn a_message_sent_after_an_observation_is_read_apart_once_joined() {
        // A text agent's observation and a person's message after it arrive as one once
        // consecutive user messages are joined; the person's message is a request, however
        // it is framed, and the observation is not.
        use crate::engine::merge::merge_same_role;
        use crate::engine::tokens::{Counter, Encoding};
        for (said, rule) in [
            (
                "Operator note:\n\nDo not restart db-primary-2, the migration holds a lock for 40 minutes.",
                "Do not restart db-primary-2",
            ),
            (
                "[from the user]\nNever write outside /srv/work_7; the rest of the disk is shared.",
                "Never write outside /srv/work_7",
            ),
            (
                "Heads-up from ops\n\nKeep every output file under 5 MB, the uploader rejects larger ones.",
                "Keep every output file under 5 MB",
            ),
            (
                "ADMIN\n\nYou must not email the customer list to anyone outside billing.",
                "You must not email the customer list",
            ),
        ] {
            let mut turns = parse(json!([
                {"role": "user", "content": "Task: tidy the work directory."},
                {"role": "assistant", "content": "ls -la /srv/work_7"},
                {"role": "user", "content": "total 12\n-rw-r--r-- 1 app app 4096 Mar 3 10:02 notes_a1.txt"},
                {"role": "user", "content": said},
                {"role": "assistant", "content": "du -sh /srv/work_7"},
                {"role": "user", "content": "12K\t/srv/work_7"},
                {"role": "assistant", "content": "done"},
                {"role": "user", "content": "thanks"},
            ]));
            merge_same_role(&mut turns, &Counter::new(Encoding::O200k));
            let d = digest(None, &turns, 10_000);
            let asks = asks_of(&d);
            assert!(asks.contains(rule), "{rule}\n{d}");
            assert!(!asks.contains("total 12"), "{d}");
        }
    }

    #[test]
    fn prose_with_calls_in_it_is_no_program() {
        for text in [
            "I ran `df.head()` and the first rows look right.",
            "The fix is in parse(): it now returns early.",
            "Done!",
            "Let me look at config.yaml next.",
        ] {
            assert!(!scan::is_code(text), "{text}");
        }
    }

    #[test]
    fn a_text_agent_answering_in_bare_commands_gets_outputs_not_requests() {
        let said = [
            "Please keep the solver under 64 MiB of memory, the grader kills it above.",
            "hey, do not delete anything in /srv/keys, we need those later",
            "Also: you have about 20 attempts left on this box.",
            "One rule from me: never run the exploit against the live host.",
        ];
        for (i, words) in said.into_iter().enumerate() {
            let turns = parse(json!([
                {"role": "user", "content": "Task: recover the passphrase from the archive."},
                {"role": "assistant", "content": "ls -la"},
                {"role": "user", "content": "total 8\n-rw-r--r-- 1 ctf ctf 512 Jan 3 10:02 vault_q7.zip"},
                {"role": "assistant", "content": format!("unzip -l vault_q{i}.zip")},
                {"role": "user", "content": "No output"},
                {"role": "user", "content": words},
                {"role": "assistant", "content": "zip2john vault_q7.zip"},
                {"role": "user", "content": "Command not found\nReport saved to out/crack_q7.txt"},
                // A message that reads as prose (a shell comment) is answered all the same.
                {"role": "assistant", "content": "# The archive uses legacy encryption, so try the wordlist on it next."},
                {"role": "user", "content": "Session completed, no hashes cracked"},
            ]));
            let d = digest(None, &turns, 10_000);
            let asks = asks_of(&d);
            assert!(asks.contains(words), "{words}\n{d}");
            for output in [
                "No output",
                "total 8",
                "Command not found",
                "Session completed",
            ] {
                assert!(!asks.contains(output), "{output}\n{d}");
            }
            assert!(d.contains("command: unzip -l vault_q"), "{d}");
            assert!(d.contains("out/crack_q7.txt"), "{d}");
        }
        // One reply that reads as a command makes no text agent of a chat: the user's
        // answer after it is still a request.
        let chat = parse(json!([
            {"role": "user", "content": "What's the command to list hidden files?"},
            {"role": "assistant", "content": "ls -a"},
            {"role": "user", "content": "thanks, that works now"},
        ]));
        let d = digest(None, &chat, 10_000);
        assert!(d.contains("- thanks, that works now"), "{d}");
    }

    #[test]
    fn a_limit_in_the_middle_of_a_long_message_is_kept_with_its_rules() {
        let filler = "Some background on how the importer got here over the years. ".repeat(12);
        for limit in [
            "The vendor API allows no more than 30 requests per minute.",
            "Keep each batch under 500 rows.",
            "Our budget is 2 GiB of memory per worker",
            "Retries must stop after 90 seconds.",
        ] {
            let message = format!(
                "Never push to main directly. {filler}\n{limit}\n{filler} Always open a pull request."
            );
            let turns = parse(json!([
                {"role": "user", "content": "Speed up the importer."},
                {"role": "user", "content": message},
                {"role": "assistant", "content": "Decision: we stream the rows through a bounded channel_q8."},
            ]));
            for budget in [10_000, 1_000, 400] {
                let d = digest(None, &turns, budget);
                assert!(d.len() <= budget, "{d}");
                let kept = limit.trim_end_matches('.');
                assert!(d.contains(kept), "{budget}: {limit}\n{d}");
                assert!(d.contains("Never push to main directly."), "{budget}: {d}");
            }
        }
    }

    #[test]
    fn a_number_the_user_states_ranks_with_the_facts() {
        for said in [
            "fwiw the staging bucket holds about 3 TB",
            "The queue peaks near 1200 messages a second.",
            "each render takes 40ms on my laptop",
            "that table is 80 columns wide",
        ] {
            let turns = parse(json!([
                {"role": "user", "content": "Make the export faster."},
                {"role": "user", "content": said},
                {"role": "user", "content": "Thanks, and what about the docs?"},
                {"role": "assistant", "content": "Let's open the exporter and see what it does first."},
            ]));
            let mut d = Digest::new(10_000);
            d.add_turns(&turns);
            let item = d.items.iter().find(|i| i.text == said);
            assert_eq!(item.map(|i| i.tier), Some(Tier::Fact), "{said}");
        }
    }

    #[test]
    fn a_long_message_cut_to_its_ends_still_ranks_and_reads_as_its_rule() {
        // A question, a pasted line, then the rule inside a long line: cut to the
        // message's ends at a small budget, the rule is left out of what is kept.
        let message =
            "how does the scoring work?\nGITHUB_TOKEN=ghp_Sd5EtHvDzyxtXqOjoGdoNrMfPmKQeDmLlDbO\n\
            Quick note before you go on. Never push to the release/zb62 branch, only open pull \
            requests against it. For context: the nightly import handles 749540 rows, so \
            anything quadratic will time out. Carry on.";
        let turns = parse(json!([
            {"role": "user", "content": message},
            {"role": "assistant", "content": "I'll replace the hand-written retry loop with backoff_rh51() instead of patching each call site."},
            {"role": "user", "content": "ok"},
        ]));
        let budget = 200;
        let d = digest(None, &turns, budget);
        assert!(d.len() <= budget, "{d}");
        assert!(
            d.contains(
                "Never push to the release/zb62 branch, only open pull requests against it."
            ),
            "{d}"
        );
    }

    #[test]
    fn shorten_keeps_the_format() {
        let d = digest(None, &session(), 10_000);
        let short = shorten(&d, 250);
        assert!(short.len() <= 250, "{short}");
        assert!(short.starts_with("Requests:"), "{short}");
        let foreign = "x".repeat(1000);
        assert!(shorten(&foreign, 300).contains("omitted by compaction"));
    }

    #[test]
    fn a_tight_digest_has_word_headings_without_blank_lines_and_reads_back_whole() {
        let items = |d: &str| -> Vec<String> {
            d.lines()
                .filter(|l| l.starts_with("- ") || l.starts_with("  "))
                .map(str::to_string)
                .collect()
        };
        let tight = digest(None, &session(), TIGHT_BELOW - 1);
        let words: Vec<&str> = SECTIONS.iter().map(|s| s.tight_heading()).collect();
        let headings: Vec<&str> = tight.lines().filter(|l| items(l).is_empty()).collect();
        assert!(headings.len() > 1, "{tight}");
        assert!(headings.iter().all(|h| words.contains(h)), "{tight}");
        assert!(!tight.contains("\n\n") && !tight.contains("## "), "{tight}");
        // Two tokens a heading, not four: the same items in fewer characters.
        let mut d = Digest::new(TIGHT_BELOW - 1);
        d.read_previous(&tight);
        assert_eq!(d.render(), tight);
        d.layout = Layout::Short;
        let short = d.render();
        assert_eq!(items(&short), items(&tight));
        assert!(
            tight.len() + headings.len() < short.len(),
            "{tight}\n{short}"
        );
        // Read back, alone or merged into the next digest, every item stays.
        let again = shorten(&tight, 10_000);
        assert!(again.starts_with(Section::Asks.heading()), "{again}");
        assert_eq!(items(&again), items(&tight));
        let later = parse(json!([
            {"role": "assistant", "content": "Decision: we keep the retry loop in src/net.rs."},
        ]));
        let next = digest(Some(&tight), &later, 10_000);
        // The previews of the last turns are replaced by the new stretch's, by design.
        let carried = d.items.iter().filter(|i| i.section != Section::Last);
        for item in carried {
            let line = format!("\n- {}{}\n", item.lead(), item.text);
            assert!(next.contains(&line), "{line}\n{next}");
        }
        assert!(
            next.contains("- Decision: we keep the retry loop"),
            "{next}"
        );
        assert!(!next.contains(H_EARLIER), "{next}");
    }

    #[test]
    fn a_word_heading_inside_other_text_is_not_read_as_a_digest() {
        // An LLM's summary may hold a line such as "Errors:": only a tight digest opens
        // with one of its headings.
        let foreign = "The build was fixed.\nErrors:\n- none left";
        let carried = shorten(foreign, 10_000);
        assert!(carried.contains("The build was fixed."), "{carried}");
        let next = digest(Some(foreign), &session(), 10_000);
        assert!(next.starts_with(H_EARLIER), "{next}");
        assert!(
            next.contains("The build was fixed.\nErrors:\n- none left"),
            "{next}"
        );
        // Beside an LLM's checkpoint (a chunk whose update was rejected), a tight digest is
        // read item by item and the checkpoint carried whole.
        let checkpoint = "## Active Task\nFix the build.\nErrors:\n- none";
        let beside = format!("{checkpoint}\n\nErrors:\n- error: boom in src/a.rs");
        let next = shorten(&beside, 10_000);
        assert!(
            next.contains(checkpoint.replace("## ", "### ").as_str()),
            "{next}"
        );
        let errors = format!("{}\n- error: boom in src/a.rs", Section::Errors.heading());
        assert!(next.contains(&errors), "{next}");
        // Cut to its heading and an emptied item (the digest's smallest form), a tight
        // digest is still ours: its next form is a digest, not an "earlier summary".
        assert!(is_digest("Decisions:\n-"));
        assert!(!shorten("Decisions:\n-", 10_000).contains(H_EARLIER));
        // Headings of each layout and version are read back.
        for heading in ["## Errors", "## Errors seen", "Errors:"] {
            let body = format!("{heading}\n- error: boom in src/a.rs");
            let read = shorten(&body, 10_000);
            assert!(
                read.starts_with(Section::Errors.heading()),
                "{heading}: {read}"
            );
            assert!(
                read.contains("- error: boom in src/a.rs"),
                "{heading}: {read}"
            );
        }
    }
}
