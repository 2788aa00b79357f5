//! How an agent's sentence decides the work, read one way for the digest's list of
//! decisions and for the lines a cut keeps of an agent's message: by a phrase that says
//! it decides, by a step announced that names what it acts on, by its build alone
//! ([`commitment::commits`]), or not at all.

use super::{commitment, scan};

/// What an agent's sentence does to the course of the work.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Decision {
    /// Said with a phrase that decides ("We settled on zstd", "Redis it is").
    Phrased,
    /// A step announced that is not exploring and names what it acts on ("I'll replace
    /// the retry loop with backoff()"): it decides how the work goes on.
    Step,
    /// Committed to by its build, whatever its verb ("Going with orjson").
    Committed,
    /// A step announced that only narrates ("Let's open the file").
    Narration,
    /// A step that names nothing ("I will suggest the necessary changes"), which the next
    /// turns say again in their own words, or no decision at all.
    Unnamed,
}

impl Decision {
    /// Whether the sentence chose something a later turn could not guess.
    pub fn chooses(self) -> bool {
        matches!(self, Self::Phrased | Self::Step | Self::Committed)
    }
}

/// How `sentence` decides.
pub fn decision(sentence: &str) -> Decision {
    match scan::phrased_decision(sentence) {
        Some(true) => Decision::Phrased,
        Some(false) if commitment::is_narration(sentence) => Decision::Narration,
        Some(false) if commitment::names_something(sentence) => Decision::Step,
        _ if commitment::commits(sentence) => Decision::Committed,
        Some(false) | None => Decision::Unnamed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_after_go_ahead_is_read_by_the_verb_that_follows() {
        for s in [
            "I'll go ahead and replace the retry loop with backoff_q2().",
            "We'll go ahead and move the validation into checks_q4.py.",
            "Let's go ahead and rename the flag to --dry-run-q7 everywhere.",
            "I will just go ahead and drop the legacy_q1 table.",
        ] {
            assert!(decision(s).chooses(), "{s}");
        }
        for s in [
            "I'll go ahead and run the tests in tests/unit_q3.",
            "Let's go ahead and check the logs in /var/log/app_q5.log.",
            "We'll go ahead and read src/app_q8.py first.",
            "I'll go ahead and see what config_q2.yaml holds.",
        ] {
            assert_eq!(decision(s), Decision::Narration, "{s}");
        }
    }
}
