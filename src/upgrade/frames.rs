//! Where one direction of a relayed WebSocket is in its frames (RFC 6455, section 5), read
//! as the bytes pass and never changed: whether it stands between two messages, and what
//! each finished text message's `type` was. The relay needs no more to close a WebSocket
//! cleanly at shutdown: only between messages may a close frame of its own go in, and
//! only a Responses WebSocket's message types say whether a response is in flight.

/// How much of a text message is kept to read its `type`: the field leads the events of
/// the Responses API (`{"type":"response.create",...}`).
const HEAD: usize = 256;

/// What a finished message said, as far as the relay cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finished {
    /// A text message whose JSON head names this `type`.
    Typed(String),
    /// A message the relay cannot read: compressed (`permessage-deflate` sets RSV1 on its
    /// first frame) or binary.
    Opaque,
    /// A text message without a `type` the relay could find.
    Untyped,
    /// A close frame: the peers close the connection themselves.
    Close,
}

#[derive(Debug, Clone)]
enum Part {
    /// Reading a frame's head: its bytes so far.
    Head { bytes: [u8; 14], len: usize },
    /// Reading a frame's payload.
    Payload {
        left: u64,
        mask: Option<[u8; 4]>,
        /// Bytes of this frame's payload read so far, for the mask's phase.
        at: u64,
        fin: bool,
        control: bool,
        close: bool,
    },
}

/// One direction's reader.
#[derive(Debug, Clone)]
pub struct Frames {
    part: Part,
    /// Inside a data message whose final frame has not been read.
    in_message: bool,
    /// The message's head, unmasked, when it is a text message the relay can read.
    head: Option<Vec<u8>>,
    opaque: bool,
}

impl Default for Frames {
    fn default() -> Self {
        Frames {
            part: Part::Head {
                bytes: [0; 14],
                len: 0,
            },
            in_message: false,
            head: None,
            opaque: false,
        }
    }
}

impl Frames {
    /// Whether the bytes read so far end between two messages: no frame begun, no
    /// fragmented message open.
    pub fn between_messages(&self) -> bool {
        matches!(self.part, Part::Head { len: 0, .. }) && !self.in_message
    }

    /// Reads `data` up to the end of the first message (or close frame) it finishes;
    /// returns how many bytes were read and what finished there, if anything. Call again
    /// with the rest.
    pub fn read(&mut self, data: &[u8]) -> (usize, Option<Finished>) {
        let mut used = 0;
        while used < data.len() {
            let (n, finished) = self.step(&data[used..]);
            used += n;
            if finished.is_some() {
                return (used, finished);
            }
        }
        (used, None)
    }

    fn step(&mut self, data: &[u8]) -> (usize, Option<Finished>) {
        match &mut self.part {
            Part::Head { bytes, len } => {
                let take = (head_len(&bytes[..*len]) - *len).min(data.len());
                bytes[*len..*len + take].copy_from_slice(&data[..take]);
                *len += take;
                if *len == head_len(&bytes[..*len]) {
                    let head = *bytes;
                    let finished = self.begin_frame(&head);
                    return (take, finished);
                }
                (take, None)
            }
            Part::Payload { left, .. } => {
                let take = usize::try_from(*left).unwrap_or(usize::MAX).min(data.len());
                self.keep(&data[..take]);
                (take, self.payload_read(take as u64))
            }
        }
    }

    /// The head is whole: sets up the payload; a frame without one ends here.
    fn begin_frame(&mut self, head: &[u8; 14]) -> Option<Finished> {
        let (fin, rsv1, opcode) = (head[0] & 0x80 != 0, head[0] & 0x40 != 0, head[0] & 0x0F);
        let masked = head[1] & 0x80 != 0;
        let (len, at) = match head[1] & 0x7F {
            126 => (u64::from(u16::from_be_bytes([head[2], head[3]])), 4),
            127 => (
                u64::from_be_bytes(head[2..10].try_into().unwrap_or([0xFF; 8])),
                10,
            ),
            short => (u64::from(short), 2),
        };
        let mask = masked.then(|| [head[at], head[at + 1], head[at + 2], head[at + 3]]);
        let control = opcode >= 8;
        if !control && opcode != 0 {
            // The first frame of a data message.
            self.in_message = true;
            self.opaque = rsv1 || opcode != 1;
            self.head = (!self.opaque).then(Vec::new);
        }
        self.part = Part::Payload {
            left: len,
            mask,
            at: 0,
            fin,
            control,
            close: opcode == 8,
        };
        self.payload_read(0)
    }

    /// Keeps the unmasked bytes of a text message's head.
    fn keep(&mut self, bytes: &[u8]) {
        let Part::Payload {
            mask, at, control, ..
        } = &self.part
        else {
            return;
        };
        let Some(head) = self.head.as_mut().filter(|_| !*control) else {
            return;
        };
        let room = HEAD.saturating_sub(head.len()).min(bytes.len());
        for (i, b) in bytes[..room].iter().enumerate() {
            let phase = usize::try_from((*at + i as u64) % 4).unwrap_or(0);
            head.push(mask.map_or(*b, |m| b ^ m[phase]));
        }
    }

    /// `n` more payload bytes were read; at the frame's end, what it finished.
    fn payload_read(&mut self, n: u64) -> Option<Finished> {
        let Part::Payload {
            left,
            at,
            fin,
            control,
            close,
            ..
        } = &mut self.part
        else {
            return None;
        };
        *left -= n;
        *at += n;
        if *left > 0 {
            return None;
        }
        let (fin, control, close) = (*fin, *control, *close);
        self.part = Part::Head {
            bytes: [0; 14],
            len: 0,
        };
        if close {
            return Some(Finished::Close);
        }
        if control || !fin {
            return None;
        }
        self.in_message = false;
        Some(match self.head.take() {
            _ if self.opaque => Finished::Opaque,
            Some(head) => type_of(&head).map_or(Finished::Untyped, Finished::Typed),
            None => Finished::Untyped,
        })
    }
}

/// The length of a frame's head, as far as its first bytes tell (at least 2).
fn head_len(bytes: &[u8]) -> usize {
    if bytes.len() < 2 {
        return 2;
    }
    let extended = match bytes[1] & 0x7F {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if bytes[1] & 0x80 != 0 { 4 } else { 0 };
    2 + extended + mask
}

/// The value of the first `"type"` field in a JSON text's head.
fn type_of(head: &[u8]) -> Option<String> {
    let at = memchr::memmem::find(head, b"\"type\"")? + 6;
    let rest = head[at..].trim_ascii_start().strip_prefix(b":")?;
    let rest = rest.trim_ascii_start().strip_prefix(b"\"")?;
    let end = memchr::memchr(b'"', rest)?;
    String::from_utf8(rest[..end].to_vec()).ok()
}

/// A close frame with code 1001 (going away), as a server sends it (unmasked).
pub fn server_going_away() -> Vec<u8> {
    let mut frame = vec![0x88, 0];
    frame.extend_from_slice(&1001u16.to_be_bytes());
    frame.extend_from_slice(GOING_AWAY);
    frame[1] = (frame.len() - 2) as u8;
    frame
}

/// A close frame with code 1001, as a client sends it: masked, with a key that varies
/// per connection (RFC 6455 asks for an unpredictable one; the payload is ours).
pub fn client_going_away(key: [u8; 4]) -> Vec<u8> {
    let mut payload = 1001u16.to_be_bytes().to_vec();
    payload.extend_from_slice(GOING_AWAY);
    let mut frame = vec![0x88, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&key);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    frame
}

const GOING_AWAY: &[u8] = b"going away";

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(fin: bool, opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
        let mut out = vec![u8::from(fin) << 7 | opcode];
        let m = if mask.is_some() { 0x80 } else { 0 };
        match payload.len() {
            n if n < 126 => out.push(m | n as u8),
            n if n < 65536 => {
                out.push(m | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(m | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        match mask {
            Some(key) => {
                out.extend_from_slice(&key);
                out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
            }
            None => out.extend_from_slice(payload),
        }
        out
    }

    /// Everything `bytes` finishes, read in pieces of `step` bytes.
    fn finished(bytes: &[u8], step: usize) -> (Vec<Finished>, bool) {
        let mut frames = Frames::default();
        let mut out = Vec::new();
        for piece in bytes.chunks(step) {
            let mut rest = piece;
            while !rest.is_empty() {
                let (n, done) = frames.read(rest);
                out.extend(done);
                rest = &rest[n..];
            }
        }
        (out, frames.between_messages())
    }

    #[test]
    fn each_message_type_is_read_however_the_bytes_are_split() {
        let big = format!(
            "{{\"type\": \"response.output_text.delta\",\"delta\":\"{}\"}}",
            "x".repeat(70_000)
        );
        let mut bytes = frame(
            true,
            1,
            br#"{"type":"response.create","model":"m"}"#,
            Some([1, 2, 3, 4]),
        );
        bytes.extend(frame(true, 9, b"ping", None));
        bytes.extend(frame(true, 1, big.as_bytes(), None));
        bytes.extend(frame(true, 1, br#"{"type":"response.completed"}"#, None));
        for step in [1, 2, 3, 7, 200, bytes.len()] {
            let (done, between) = finished(&bytes, step);
            assert_eq!(
                done,
                vec![
                    Finished::Typed("response.create".into()),
                    Finished::Typed("response.output_text.delta".into()),
                    Finished::Typed("response.completed".into()),
                ],
                "pieces of {step}"
            );
            assert!(between);
        }
    }

    #[test]
    fn a_fragmented_message_is_open_until_its_final_frame_even_past_a_ping() {
        let mut bytes = frame(false, 1, br#"{"ty"#, None);
        bytes.extend(frame(true, 9, b"", None));
        let mut frames = Frames::default();
        assert_eq!(frames.read(&bytes), (bytes.len(), None));
        assert!(!frames.between_messages());
        let last = frame(true, 0, br#"pe":"error"}"#, None);
        assert_eq!(
            frames.read(&last),
            (last.len(), Some(Finished::Typed("error".into())))
        );
        assert!(frames.between_messages());
    }

    #[test]
    fn compressed_binary_and_close_frames_are_told_apart() {
        let mut compressed = frame(true, 1, b"\x00\x01", None);
        compressed[0] |= 0x40;
        assert_eq!(finished(&compressed, 1).0, vec![Finished::Opaque]);
        assert_eq!(
            finished(&frame(true, 2, b"{\"type\":\"x\"}", None), 3).0,
            vec![Finished::Opaque]
        );
        assert_eq!(
            finished(&frame(true, 1, b"plain words", None), 3).0,
            vec![Finished::Untyped]
        );
        assert_eq!(finished(&server_going_away(), 1).0, vec![Finished::Close]);
        assert_eq!(
            finished(&client_going_away([9, 8, 7, 6]), 1).0,
            vec![Finished::Close]
        );
    }

    #[test]
    fn a_frame_cut_in_its_head_or_payload_is_not_between_messages() {
        let bytes = frame(
            true,
            1,
            br#"{"type":"response.create"}"#,
            Some([5, 6, 7, 8]),
        );
        for cut in 1..bytes.len() {
            let mut frames = Frames::default();
            assert_eq!(frames.read(&bytes[..cut]), (cut, None));
            assert!(!frames.between_messages(), "cut at {cut}");
        }
    }

    #[test]
    fn the_going_away_frames_carry_code_1001() {
        let server = server_going_away();
        assert_eq!(&server[..4], &[0x88, 12, 0x03, 0xE9]);
        let client = client_going_away([1, 2, 3, 4]);
        assert_eq!(client[1], 0x80 | 12);
        assert_eq!([client[6] ^ 1, client[7] ^ 2], [0x03, 0xE9]);
    }
}
