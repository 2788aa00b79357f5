//! The irregular verbs the readings meet, each with its past form and participle: one
//! table for every reading that asks what form a word is ([`super::commitment`] for the
//! base a form is of, [`super::constraint`] for a past that reports and a participle that
//! infers).

/// An irregular verb: its base, its past form and its participle.
struct Irregular {
    base: &'static str,
    past: &'static str,
    participle: &'static str,
}

const fn verb(base: &'static str, past: &'static str, participle: &'static str) -> Irregular {
    Irregular {
        base,
        past,
        participle,
    }
}

/// The irregular verbs of the readings' lists, "be" once for each of its past forms.
const IRREGULAR: &[Irregular] = &[
    verb("be", "was", "been"),
    verb("be", "were", "been"),
    verb("have", "had", "had"),
    verb("do", "did", "done"),
    verb("go", "went", "gone"),
    verb("see", "saw", "seen"),
    verb("run", "ran", "run"),
    verb("take", "took", "taken"),
    verb("find", "found", "found"),
    verb("begin", "began", "begun"),
    verb("make", "made", "made"),
    verb("get", "got", "gotten"),
    verb("give", "gave", "given"),
    verb("write", "wrote", "written"),
    verb("think", "thought", "thought"),
    verb("know", "knew", "known"),
    verb("feel", "felt", "felt"),
    verb("mean", "meant", "meant"),
    verb("understand", "understood", "understood"),
    verb("say", "said", "said"),
    verb("tell", "told", "told"),
    verb("keep", "kept", "kept"),
    verb("choose", "chose", "chosen"),
    verb("stick", "stuck", "stuck"),
    verb("leave", "left", "left"),
    verb("fall", "fell", "fallen"),
    verb("forget", "forgot", "forgotten"),
    verb("learn", "learnt", "learnt"),
    verb("come", "came", "come"),
    verb("hear", "heard", "heard"),
    verb("break", "broke", "broken"),
    verb("become", "became", "become"),
    verb("lose", "lost", "lost"),
    verb("send", "sent", "sent"),
    verb("build", "built", "built"),
    verb("spend", "spent", "spent"),
    verb("grow", "grew", "grown"),
    verb("hit", "hit", "hit"),
    verb("read", "read", "read"),
    verb("set", "set", "set"),
    verb("put", "put", "put"),
    verb("show", "showed", "shown"),
];

/// Present forms that are not their verb's base.
const PRESENT: &[(&str, &str)] = &[("is", "be"), ("am", "be"), ("are", "be"), ("has", "have")];

/// The base `word` is an irregular form of: a past form, a participle, or a present form
/// unlike the base ("has", "is").
pub fn base_of(word: &str) -> Option<&'static str> {
    IRREGULAR
        .iter()
        .find(|v| word.eq_ignore_ascii_case(v.past) || word.eq_ignore_ascii_case(v.participle))
        .map(|v| v.base)
        .or_else(|| {
            PRESENT
                .iter()
                .find(|(form, _)| word.eq_ignore_ascii_case(form))
                .map(|(_, base)| *base)
        })
}

/// Whether `word` is an irregular past form that no base shares ("took", "was"; not "set"
/// or "read", which as often ask as report).
pub fn is_past(word: &str) -> bool {
    IRREGULAR
        .iter()
        .any(|v| word.eq_ignore_ascii_case(v.past) && v.past != v.base)
}

/// Whether `word` is an irregular participle ("taken", "been", "set").
pub fn is_participle(word: &str) -> bool {
    IRREGULAR
        .iter()
        .any(|v| word.eq_ignore_ascii_case(v.participle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_form_is_known_for_what_it_is() {
        for (form, base) in [
            ("took", "take"),
            ("taken", "take"),
            ("were", "be"),
            ("has", "have"),
        ] {
            assert_eq!(base_of(form), Some(base), "{form}");
        }
        assert_eq!(base_of("walked"), None);
        assert!(is_past("Went") && is_past("kept") && !is_past("set") && !is_past("taken"));
        assert!(is_participle("written") && is_participle("set") && !is_participle("wrote"));
    }
}
