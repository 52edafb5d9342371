//! Files that check themselves, for what Perch keeps in its cache directory (the host copies,
//! the prefix cache's disk tier): a magic, the lengths of a JSON header and of the data after
//! it (u64 LE), the SHA-256 of header and data, then the header and the data. A reader checks
//! the lengths against the file's size before it allocates anything and the checksum once the
//! data has been read, so a truncated, padded, corrupt or foreign file is an error, never a
//! panic and never a read past the file's end.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// Magic, two lengths, checksum.
pub const PREAMBLE: u64 = 8 + 8 + 8 + 32;

/// One kind of file: its magic (which carries the format's version) and the longest header a
/// file of this kind may have.
pub struct Format {
    pub magic: &'static [u8; 8],
    pub max_header: u64,
}

/// Why a file could not be read.
#[derive(Debug, PartialEq)]
pub enum ReadError {
    Missing,
    Bad(&'static str),
}

impl Format {
    /// Write `header` and the `data_len` bytes that `data` hands to its sink into `path`
    /// (created or truncated), the checksum last, then sync. Callers write to a temporary name
    /// and rename, so a reader never sees a file half written.
    pub fn write<H: Serialize>(
        &self,
        path: &Path,
        header: &H,
        data_len: u64,
        data: impl FnOnce(&mut dyn FnMut(&[u8]) -> io::Result<()>) -> io::Result<()>,
    ) -> io::Result<()> {
        let header = serde_json::to_vec(header).map_err(io::Error::other)?;
        let mut f = BufWriter::with_capacity(1 << 20, crate::private_files::create(path)?);
        f.write_all(self.magic)?;
        f.write_all(&(header.len() as u64).to_le_bytes())?;
        f.write_all(&data_len.to_le_bytes())?;
        f.write_all(&[0u8; 32])?; // the checksum, written last
        let mut sum = Sha256::new();
        sum.update(&header);
        f.write_all(&header)?;
        let mut written = 0u64;
        data(&mut |bytes: &[u8]| {
            sum.update(bytes);
            written += bytes.len() as u64;
            f.write_all(bytes)
        })?;
        if written != data_len {
            return Err(io::Error::other(format!("wrote {written} data bytes, not {data_len}")));
        }
        let mut f = f.into_inner().map_err(|e| e.into_error())?;
        f.seek(SeekFrom::Start(24))?;
        f.write_all(&sum.finalize())?;
        f.sync_all()
    }

    /// The header of a file whose lengths match its size, and that size. Neither the data nor
    /// the checksum is read: this is for indexing and pruning a directory.
    pub fn header<H: DeserializeOwned>(&self, path: &Path) -> Option<(H, u64)> {
        let mut r = self.open(path).ok()?;
        let h = r.header().ok()?;
        Some((h, r.size))
    }

    /// Open `path` for a full read: the preamble read and its lengths checked against the
    /// file's size.
    pub fn open(&self, path: &Path) -> Result<Reader, ReadError> {
        let f = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadError::Missing),
            Err(_) => return Err(ReadError::Bad("unreadable")),
        };
        let size = f.metadata().map_err(|_| ReadError::Bad("unreadable"))?.len();
        let mut f = BufReader::with_capacity(1 << 20, f);
        let mut pre = [0u8; PREAMBLE as usize];
        f.read_exact(&mut pre).map_err(|_| ReadError::Bad("truncated"))?;
        if &pre[..8] != self.magic {
            return Err(ReadError::Bad("not a file of this kind"));
        }
        let word = |at: usize| u64::from_le_bytes(pre[at..at + 8].try_into().unwrap_or([0; 8]));
        let (header_len, data_len) = (word(8), word(16));
        if header_len > self.max_header
            || PREAMBLE.checked_add(header_len).and_then(|n| n.checked_add(data_len)) != Some(size)
        {
            return Err(ReadError::Bad("truncated or padded"));
        }
        let mut want = [0u8; 32];
        want.copy_from_slice(&pre[24..56]);
        Ok(Reader { f, sum: Sha256::new(), want, header_len, data_len, left: data_len, size })
    }
}

/// A file being read: its header first, then its data in pieces, then `finish`.
pub struct Reader {
    f: BufReader<File>,
    sum: Sha256,
    want: [u8; 32],
    /// The header's length until it has been read, then 0.
    header_len: u64,
    data_len: u64,
    /// Data bytes not read yet.
    left: u64,
    /// The file's size.
    pub size: u64,
}

impl Reader {
    /// The whole data's length, from the preamble (checked against the file's size).
    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    /// The header, parsed; call once, before any `take`.
    pub fn header<H: DeserializeOwned>(&mut self) -> Result<H, &'static str> {
        if self.header_len == 0 && self.left != self.data_len {
            return Err("header read after the data");
        }
        let n = std::mem::take(&mut self.header_len) as usize;
        let bytes = self.read(n)?;
        serde_json::from_slice(&bytes).map_err(|_| "bad header")
    }

    /// The next `n` bytes of the data; an error (and nothing allocated) if fewer remain.
    pub fn take(&mut self, n: usize) -> Result<Vec<u8>, &'static str> {
        if self.header_len != 0 {
            return Err("data read before the header");
        }
        if n as u64 > self.left {
            return Err("data too short");
        }
        self.left -= n as u64;
        self.read(n)
    }

    /// Every data byte read and the checksum right.
    pub fn finish(self) -> Result<(), &'static str> {
        if self.left != 0 {
            return Err("data too long");
        }
        match self.sum.finalize()[..] == self.want {
            true => Ok(()),
            false => Err("checksum mismatch"),
        }
    }

    fn read(&mut self, n: usize) -> Result<Vec<u8>, &'static str> {
        let mut buf = vec![0u8; n];
        self.f.read_exact(&mut buf).map_err(|_| "truncated")?;
        self.sum.update(&buf);
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT: Format = Format { magic: b"PERCHT01", max_header: 1 << 10 };

    fn written(dir: &Path, data: &[u8]) -> std::path::PathBuf {
        let path = dir.join("f.bin");
        FORMAT.write(&path, &vec!["h".to_string()], data.len() as u64, |put| put(data)).unwrap();
        path
    }

    fn read_all(path: &Path) -> Result<(Vec<String>, Vec<u8>), ReadError> {
        let mut r = FORMAT.open(path)?;
        let h: Vec<String> = r.header().map_err(ReadError::Bad)?;
        let data = r.take(r.data_len() as usize).map_err(ReadError::Bad)?;
        r.finish().map_err(ReadError::Bad)?;
        Ok((h, data))
    }

    #[test]
    fn a_file_reads_back_and_every_damage_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..=255).collect();
        let path = written(tmp.path(), &data);
        assert_eq!(read_all(&path), Ok((vec!["h".into()], data.clone())));
        assert_eq!(FORMAT.header::<Vec<String>>(&path).map(|(h, _)| h), Some(vec!["h".into()]));
        let bytes = std::fs::read(&path).unwrap();
        let damaged = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            read_all(&path).unwrap_err()
        };
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(damaged(&flipped), ReadError::Bad("checksum mismatch"));
        assert_eq!(damaged(&bytes[..bytes.len() - 1]), ReadError::Bad("truncated or padded"));
        assert_eq!(damaged(&[&bytes[..], b"x"].concat()), ReadError::Bad("truncated or padded"));
        assert_eq!(damaged(&bytes[..10]), ReadError::Bad("truncated"));
        let mut foreign = bytes.clone();
        foreign[..8].copy_from_slice(b"PERCHT02");
        assert_eq!(damaged(&foreign), ReadError::Bad("not a file of this kind"));
        // A header length beyond the format's limit is refused before anything is allocated.
        let mut huge = bytes.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(damaged(&huge), ReadError::Bad("truncated or padded"));
        assert!(FORMAT.header::<Vec<String>>(&path).is_none());
        std::fs::remove_file(&path).unwrap();
        assert_eq!(read_all(&path).unwrap_err(), ReadError::Missing);
    }

    #[test]
    fn a_writer_that_miscounts_its_data_fails() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f.bin");
        let err = FORMAT.write(&path, &0, 5, |put| put(b"four")).unwrap_err();
        assert!(err.to_string().contains("wrote 4 data bytes, not 5"), "{err}");
    }
}
