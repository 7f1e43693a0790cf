//! A segment's packet file: in, the encoded video packets of one segment (and the encoder's
//! codec headers); out, the same packets read back in order, with their timestamps, duration
//! and flags exactly as the encoder gave them, for the join to mux into OUT.
//!
//! The format is the project's own and plain: a magic line, the codec headers, then one record
//! a packet (pts, dts, duration, flags, size, bytes; little-endian). No container stands
//! between the encoder and the join: none keeps both timestamps of every packet in any time
//! base (NUT guesses decode times, Matroska rounds to milliseconds).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ffmpeg_next::Packet;

const MAGIC: &[u8; 8] = b"GPVSEG1\n";
/// `AV_NOPTS_VALUE`: a timestamp the packet does not have.
const NONE: i64 = i64::MIN;

/// Writes packets to a segment file.
pub(crate) struct PacketWriter {
    out: BufWriter<File>,
    path: PathBuf,
}

impl PacketWriter {
    /// Creates `path` with the encoder's codec headers `extradata`.
    pub(crate) fn create(path: &Path, extradata: &[u8]) -> Result<Self> {
        let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        let mut w = Self {
            out: BufWriter::new(file),
            path: path.to_path_buf(),
        };
        w.put(MAGIC)?;
        w.put(&(extradata.len() as u32).to_le_bytes())?;
        w.put(extradata)?;
        Ok(w)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.out
            .write_all(bytes)
            .with_context(|| format!("writing {}", self.path.display()))
    }

    /// Appends one packet.
    pub(crate) fn write(&mut self, p: &Packet) -> Result<()> {
        let data = p.data().unwrap_or(&[]);
        let mut head = [0u8; 32];
        head[0..8].copy_from_slice(&p.pts().unwrap_or(NONE).to_le_bytes());
        head[8..16].copy_from_slice(&p.dts().unwrap_or(NONE).to_le_bytes());
        head[16..24].copy_from_slice(&p.duration().to_le_bytes());
        head[24..28].copy_from_slice(&(p.flags().bits() as u32).to_le_bytes());
        head[28..32].copy_from_slice(&(data.len() as u32).to_le_bytes());
        self.put(&head)?;
        self.put(data)
    }

    /// Flushes the file to disk.
    pub(crate) fn finish(self) -> Result<()> {
        let path = self.path.clone();
        let file = self
            .out
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("writing {}", path.display()))?;
        file.sync_all().with_context(|| format!("writing {}", path.display()))
    }
}

/// Reads a segment file's packets in order.
pub(crate) struct PacketReader {
    input: BufReader<File>,
    path: PathBuf,
    /// The codec headers the segment's encoder gave.
    pub(crate) extradata: Vec<u8>,
}

impl PacketReader {
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("cannot open segment {}", path.display()))?;
        let mut input = BufReader::new(file);
        let mut magic = [0u8; 8];
        input
            .read_exact(&mut magic)
            .ok()
            .filter(|()| &magic == MAGIC)
            .with_context(|| format!("{} is not a gpen-video segment file", path.display()))?;
        let mut len = [0u8; 4];
        input
            .read_exact(&mut len)
            .with_context(|| format!("{}: cut short", path.display()))?;
        let mut extradata = vec![0u8; u32::from_le_bytes(len) as usize];
        input
            .read_exact(&mut extradata)
            .with_context(|| format!("{}: cut short", path.display()))?;
        Ok(Self {
            input,
            path: path.to_path_buf(),
            extradata,
        })
    }

    /// The next packet, `None` at the end.
    pub(crate) fn next_packet(&mut self) -> Result<Option<Packet>> {
        let mut head = [0u8; 32];
        match self.input.read_exact(&mut head[..1]) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", self.path.display())),
        }
        self.input
            .read_exact(&mut head[1..])
            .with_context(|| format!("{}: cut short", self.path.display()))?;
        let num = |r: std::ops::Range<usize>| i64::from_le_bytes(head[r].try_into().expect("8 bytes"));
        let (pts, dts, duration) = (num(0..8), num(8..16), num(16..24));
        let flags = u32::from_le_bytes(head[24..28].try_into().expect("4 bytes"));
        let size = u32::from_le_bytes(head[28..32].try_into().expect("4 bytes")) as usize;
        if size > 1 << 30 {
            bail!("{}: damaged (a packet of {size} bytes)", self.path.display());
        }
        let mut p = Packet::new(size);
        if let Some(data) = p.data_mut() {
            self.input
                .read_exact(data)
                .with_context(|| format!("{}: cut short", self.path.display()))?;
        }
        p.set_pts((pts != NONE).then_some(pts));
        p.set_dts((dts != NONE).then_some(dts));
        p.set_duration(duration);
        p.set_flags(ffmpeg_next::packet::Flags::from_bits_truncate(flags as i32));
        Ok(Some(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_come_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.seg");
        let mut w = PacketWriter::create(&path, b"headers").unwrap();
        let mut p = Packet::copy(b"abc");
        p.set_pts(Some(-3));
        p.set_dts(None);
        p.set_duration(512);
        p.set_flags(ffmpeg_next::packet::Flags::KEY);
        w.write(&p).unwrap();
        w.write(&Packet::copy(b"")).unwrap();
        w.finish().unwrap();
        let mut r = PacketReader::open(&path).unwrap();
        assert_eq!(r.extradata, b"headers");
        let q = r.next_packet().unwrap().unwrap();
        assert_eq!(
            (q.pts(), q.dts(), q.duration(), q.is_key()),
            (Some(-3), None, 512, true)
        );
        assert_eq!(q.data(), Some(&b"abc"[..]));
        let e = r.next_packet().unwrap().unwrap();
        assert_eq!(e.size(), 0);
        assert!(r.next_packet().unwrap().is_none());
        std::fs::write(&path, b"GPVSEG1\n\x00").unwrap();
        assert!(PacketReader::open(&path).is_err(), "a cut header is an error");
    }
}
