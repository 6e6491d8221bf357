//! A saved summary of what the working set learned (module
//! `working_set::learned`), as bytes: a small hand-written little-endian
//! format with a CRC-32 (`docs/decisions/learned-summary.md`).
//!
//! ```text
//! offset  size  field
//! 0       4     magic "KVGL"
//! 4       2     version (1)
//! 6       2     reserved, 0
//! 8       4     payload length n, bytes
//! 12      n     payload (version 1, below)
//! 12+n    4     CRC-32 (IEEE) of bytes 0 .. 12+n
//!
//! payload v1: engine tokens u64, block tokens u32, max_model_len u64
//! (0: unknown), means 4 × f64 (output, growth, turn ns, ln gap), prefill
//! rate f64, lifetimes: count u32 then u32 each, pair-cost envelope:
//! count u8 then (scale u8, s/token f64, keys f64) each.
//! ```
//!
//! Parsing checks everything before anything is applied: a summary is
//! taken whole or refused whole.

use std::fmt;

use super::working_set::Learned;

const MAGIC: [u8; 4] = *b"KVGL";
/// The only version this build reads and writes.
pub const SUMMARY_VERSION: u16 = 1;
const HEADER: usize = 12;
const TRAILER: usize = 4;
/// Most lifetimes a summary may carry: what the working set remembers.
const MOST_LIFETIMES: usize = crate::core::working_set::LIFETIMES_IN_SUMMARY;
/// Most envelope points: one per scale.
const MOST_SCALES: usize = crate::core::working_set::PAIR_SCALES_IN_SUMMARY;

/// Why a saved summary was refused. The gate keeps what it had, as if no
/// summary were given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SummaryError {
    /// Fewer bytes than the summary says it holds (or than a header).
    Truncated {
        /// Bytes given.
        len: usize,
        /// Bytes needed.
        needed: usize,
    },
    /// Not a kvgate summary (its first bytes are not the magic).
    Magic,
    /// Written by a version of kvgate this one does not read.
    Version {
        /// The summary's version.
        found: u16,
        /// The version this build reads.
        supported: u16,
    },
    /// The checksum does not match: the bytes were changed.
    Checksum,
    /// Bytes past the summary's end.
    TrailingBytes,
    /// A field out of range, named.
    Field(&'static str),
    /// Learned on another engine than the gate's.
    OtherEngine {
        /// The summary's engine capacity, tokens (0: unknown).
        saved_tokens: u64,
        /// The summary's block size (0: unknown).
        saved_block_tokens: u32,
        /// The gate's engine capacity, tokens.
        tokens: u64,
        /// The gate's block size.
        block_tokens: u32,
    },
}

impl fmt::Display for SummaryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { len, needed } => {
                write!(f, "summary truncated: {len} bytes, {needed} needed")
            }
            Self::Magic => write!(f, "not a kvgate summary (bad magic)"),
            Self::Version { found, supported } => write!(
                f,
                "summary version {found} is not supported (this build reads version {supported})"
            ),
            Self::Checksum => write!(f, "summary checksum mismatch (corrupted)"),
            Self::TrailingBytes => write!(f, "summary has bytes past its end"),
            Self::Field(name) => write!(f, "summary field {name} is out of range"),
            Self::OtherEngine {
                saved_tokens,
                saved_block_tokens,
                tokens,
                block_tokens,
            } => write!(
                f,
                "summary from another engine ({saved_tokens} tokens in blocks of \
                 {saved_block_tokens}; this one: {tokens} in blocks of {block_tokens})"
            ),
        }
    }
}

impl std::error::Error for SummaryError {}

/// Writes `learned` as a summary.
pub(crate) fn encode(learned: &Learned) -> Vec<u8> {
    let mut p = Vec::with_capacity(96 + 4 * learned.lifetimes.len());
    p.extend_from_slice(&learned.engine_tokens.to_le_bytes());
    p.extend_from_slice(&learned.block_tokens.to_le_bytes());
    p.extend_from_slice(&learned.max_model_len.unwrap_or(0).to_le_bytes());
    for m in learned.means {
        p.extend_from_slice(&m.to_le_bytes());
    }
    p.extend_from_slice(&learned.reported_rate.to_le_bytes());
    let lifetimes = &learned.lifetimes[..learned.lifetimes.len().min(MOST_LIFETIMES)];
    p.extend_from_slice(&(lifetimes.len() as u32).to_le_bytes());
    for t in lifetimes {
        p.extend_from_slice(&t.to_le_bytes());
    }
    let envelope = &learned.pair_envelope[..learned.pair_envelope.len().min(MOST_SCALES)];
    p.push(envelope.len() as u8);
    for &(scale, y, x) in envelope {
        p.push(scale);
        p.extend_from_slice(&y.to_le_bytes());
        p.extend_from_slice(&x.to_le_bytes());
    }
    let mut out = Vec::with_capacity(HEADER + p.len() + TRAILER);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&SUMMARY_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(p.len() as u32).to_le_bytes());
    out.extend_from_slice(&p);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Reads a summary, checking every field; nothing is applied here.
pub(crate) fn decode(bytes: &[u8]) -> Result<Learned, SummaryError> {
    let truncated = |needed| SummaryError::Truncated {
        len: bytes.len(),
        needed,
    };
    if bytes.len() < HEADER {
        // A short prefix of another file is still not ours.
        if !MAGIC.starts_with(&bytes[..bytes.len().min(4)]) {
            return Err(SummaryError::Magic);
        }
        return Err(truncated(HEADER + TRAILER));
    }
    if bytes[..4] != MAGIC {
        return Err(SummaryError::Magic);
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != SUMMARY_VERSION {
        return Err(SummaryError::Version {
            found: version,
            supported: SUMMARY_VERSION,
        });
    }
    let n = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize;
    let end = HEADER.saturating_add(n);
    let needed = end.saturating_add(TRAILER);
    if bytes.len() < needed {
        return Err(truncated(needed));
    }
    if bytes.len() > needed {
        return Err(SummaryError::TrailingBytes);
    }
    let crc = u32::from_le_bytes([bytes[end], bytes[end + 1], bytes[end + 2], bytes[end + 3]]);
    if crc32fast::hash(&bytes[..end]) != crc || bytes[6..8] != [0, 0] {
        return Err(SummaryError::Checksum);
    }
    let mut r = Reader(&bytes[HEADER..end]);
    let learned = read_payload(&mut r)?;
    if !r.0.is_empty() {
        return Err(SummaryError::Field("payload length"));
    }
    Ok(learned)
}

fn read_payload(r: &mut Reader<'_>) -> Result<Learned, SummaryError> {
    let engine_tokens = r.u64("engine tokens")?;
    let block_tokens = r.u32("block tokens")?;
    let max_model_len = r.u64("max_model_len")?;
    let mut means = [0.0; 4];
    for (m, name) in means.iter_mut().zip([
        "mean output",
        "mean growth",
        "mean turn time",
        "mean log gap",
    ]) {
        *m = r.f64(name)?;
        // The log gap is a log of nanoseconds (>= ln of the shortest gap),
        // so every mean is finite and not negative.
        if !(m.is_finite() && *m >= 0.0) {
            return Err(SummaryError::Field(name));
        }
    }
    let reported_rate = r.f64("prefill rate")?;
    if !(reported_rate.is_finite() && reported_rate >= 0.0) {
        return Err(SummaryError::Field("prefill rate"));
    }
    let count = r.u32("lifetimes")? as usize;
    if count > MOST_LIFETIMES {
        return Err(SummaryError::Field("lifetimes"));
    }
    let mut lifetimes = Vec::with_capacity(count);
    for _ in 0..count {
        let t = r.u32("lifetimes")?;
        if t == 0 {
            return Err(SummaryError::Field("lifetimes"));
        }
        lifetimes.push(t);
    }
    let count = usize::from(r.u8("pair envelope")?);
    if count > MOST_SCALES {
        return Err(SummaryError::Field("pair envelope"));
    }
    let mut pair_envelope = Vec::with_capacity(count);
    for _ in 0..count {
        let scale = r.u8("pair envelope")?;
        let (y, x) = (r.f64("pair envelope")?, r.f64("pair envelope")?);
        let fine = |v: f64| v.is_finite() && v > 0.0;
        if usize::from(scale) >= MOST_SCALES || !fine(y) || !fine(x) {
            return Err(SummaryError::Field("pair envelope"));
        }
        pair_envelope.push((scale, y, x));
    }
    Ok(Learned {
        engine_tokens,
        block_tokens,
        max_model_len: (max_model_len > 0).then_some(max_model_len),
        means,
        lifetimes,
        reported_rate,
        pair_envelope,
    })
}

/// Reads little-endian fields off the front of a payload.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self, name: &'static str) -> Result<[u8; N], SummaryError> {
        // The checksum covered the declared length: running short here is
        // a payload that lies about its fields, not a truncated file.
        let (head, rest) = self
            .0
            .split_first_chunk::<N>()
            .ok_or(SummaryError::Field(name))?;
        self.0 = rest;
        Ok(*head)
    }
    fn u8(&mut self, name: &'static str) -> Result<u8, SummaryError> {
        Ok(self.take::<1>(name)?[0])
    }
    fn u32(&mut self, name: &'static str) -> Result<u32, SummaryError> {
        Ok(u32::from_le_bytes(self.take(name)?))
    }
    fn u64(&mut self, name: &'static str) -> Result<u64, SummaryError> {
        Ok(u64::from_le_bytes(self.take(name)?))
    }
    fn f64(&mut self, name: &'static str) -> Result<f64, SummaryError> {
        Ok(f64::from_le_bytes(self.take(name)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learned() -> Learned {
        Learned {
            engine_tokens: 12_800,
            block_tokens: 32,
            max_model_len: Some(8192),
            means: [120.0, 300.5, 2.5e8, 20.1],
            lifetimes: vec![3, 10, 7],
            reported_rate: 9000.0,
            pair_envelope: vec![(3, 2e-5, 9.5), (10, 3e-5, 1500.0)],
        }
    }

    #[test]
    fn what_is_written_reads_back_the_same() {
        let l = learned();
        assert_eq!(decode(&encode(&l)).unwrap(), l);
        let none = Learned::nothing();
        assert_eq!(decode(&encode(&none)).unwrap(), none);
    }

    #[test]
    fn a_truncated_summary_is_refused_at_every_length() {
        let bytes = encode(&learned());
        for len in 0..bytes.len() {
            let err = decode(&bytes[..len]).unwrap_err();
            assert!(
                matches!(err, SummaryError::Truncated { .. }),
                "{len}: {err:?}"
            );
            assert!(err.to_string().contains("truncated"));
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode(&longer), Err(SummaryError::TrailingBytes));
    }

    #[test]
    fn a_changed_byte_is_refused() {
        let bytes = encode(&learned());
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            assert!(decode(&bad).is_err(), "byte {at} changed, read as valid");
        }
        assert_eq!(decode(b"not a summary at all"), Err(SummaryError::Magic));
        assert_eq!(decode(b"PK"), Err(SummaryError::Magic));
    }

    #[test]
    fn another_version_is_refused_by_name() {
        let mut bytes = encode(&learned());
        bytes[4] = 2;
        let err = decode(&bytes).unwrap_err();
        assert_eq!(
            err,
            SummaryError::Version {
                found: 2,
                supported: 1
            }
        );
        assert!(err.to_string().contains("version 2"));
    }

    #[test]
    fn a_field_out_of_range_is_refused_by_name() {
        let mut l = learned();
        l.means[0] = f64::NAN;
        assert_eq!(decode(&encode(&l)), Err(SummaryError::Field("mean output")));
        let mut l = learned();
        l.reported_rate = -1.0;
        assert_eq!(
            decode(&encode(&l)),
            Err(SummaryError::Field("prefill rate"))
        );
        let mut l = learned();
        l.lifetimes.push(0);
        assert_eq!(decode(&encode(&l)), Err(SummaryError::Field("lifetimes")));
        let mut l = learned();
        l.pair_envelope.push((200, 1.0, 1.0));
        assert_eq!(
            decode(&encode(&l)),
            Err(SummaryError::Field("pair envelope"))
        );
    }
}
