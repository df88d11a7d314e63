//! The chat turn both instruction benchmarks of a turn count: a thread of 200 turns (a
//! question of about 30 tokens, an answer of about 150) on gpt-4o-mini with a
//! 16,000-token window, so the fit keeps its newest turns and leaves the rest out, and a
//! new question. The store's part (reading the tail, appending, recording) is not counted:
//! the tails here are what it would hand over, every stored message's count cached as it
//! restores them.

use contexture_core::Message;
use contexture_core::fit::{CutMemory, FitPolicy};
use contexture_core::registry::{ModelInfo, Registry};
use contexture_core::tokens::message_tokens;
use contexture_engine::chat::{fit_turn, newest_turn_tokens, split_turn};
use contexture_engine::fitting::{FitOverrides, FitSettings};
use contexture_store::ProjectionTail;

/// Turns the thread holds.
pub const TURNS: usize = 200;

/// The thread's system prompt.
fn system() -> Message {
    Message::system("You are a patient tutor for a parsing course. Answer with examples.")
}

/// The thread's messages, each made anew (a request's messages are parsed, so nothing of
/// them is counted yet).
fn history() -> Vec<Message> {
    let mut messages = Vec::with_capacity(2 * TURNS);
    for turn in 0..TURNS {
        messages.push(Message::user(format!(
            "Question {turn}: how does a recursive descent parser handle a list nested \
             {turn} levels deep, and what does it cost?"
        )));
        let answer: String = (0..6)
            .map(|line| {
                format!(
                    "Step {line} of answer {turn}: the parser calls itself once per level, so \
                     the stack grows with the depth and each token is read exactly once. "
                )
            })
            .collect();
        messages.push(Message::assistant(answer));
    }
    messages
}

/// The new question.
fn question() -> Message {
    Message::user("And how would an iterative parser with its own stack compare?")
}

/// What one turn is given: the settings, the thread's tail as read before the turn, and
/// the request's messages.
pub struct ChatTurnInput {
    settings: FitSettings,
    before: ProjectionTail,
    requested: Vec<Message>,
}

/// The newest messages of `messages` a tail read for `needed` tokens holds (every count
/// cached, as the store restores them), with how many older ones it leaves unread.
fn tail_of(settings: &FitSettings, messages: &[Message], needed: u64) -> ProjectionTail {
    let encoding = settings.model.counter.encoding();
    let mut tokens = 0u64;
    let mut start = messages.len();
    while start > 0 && tokens <= needed {
        start -= 1;
        tokens += u64::from(message_tokens(&messages[start], encoding));
    }
    let read: Vec<Message> = messages[start..].to_vec();
    for message in &read {
        message_tokens(message, encoding);
    }
    let system = system();
    message_tokens(&system, encoding);
    let mut tail = ProjectionTail::empty();
    tail.projection.system = Some(system);
    tail.projection.messages = read;
    tail.unread = start;
    tail
}

impl ChatTurnInput {
    /// The turn: its request holds the whole conversation (`whole`, as a stateless client
    /// sends it) or only the new question.
    pub fn new(whole: bool) -> ChatTurnInput {
        let model = ModelInfo {
            context_window: 16_000,
            ..Registry::builtin().resolve("gpt-4o-mini")
        };
        let settings = FitSettings::new(model, FitPolicy::default(), FitOverrides::default())
            .expect("the default policy works for the model");
        let encoding = settings.model.counter.encoding();
        let needed = settings
            .history_needed()
            .expect("the default policy reads a tail");
        let stored = history();
        let mut requested = if whole {
            let mut requested = vec![system()];
            requested.extend(history());
            requested
        } else {
            Vec::new()
        };
        requested.push(question());
        let own = u64::from(message_tokens(&question(), encoding));
        let before = tail_of(&settings, &stored, needed + own);
        ChatTurnInput {
            settings,
            before,
            requested,
        }
    }

    /// The engine's part of the turn: the tokens to read for, what is new, then the fit of
    /// the tail as read with the new messages after it (what the turn stores in one write
    /// with its record). Returns how many messages are sent.
    pub fn run(self) -> usize {
        let encoding = self.settings.model.counter.encoding();
        std::hint::black_box(newest_turn_tokens(&self.requested, encoding));
        let split =
            split_turn(self.before.projection, self.requested, None).expect("the turn splits");
        assert_eq!(split.new.len(), 1, "the new question alone is new");
        let newest_turn = split.newest_turn.len();
        let mut projection = split.history;
        projection.messages.extend(split.newest_turn);
        let tail = ProjectionTail {
            projection,
            ..self.before
        };
        let fitted = fit_turn(
            &self.settings,
            tail,
            newest_turn,
            &[],
            &mut CutMemory::default(),
        )
        .expect("the turn fits");
        fitted.messages.len()
    }
}
