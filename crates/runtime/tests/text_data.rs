//! The language-modelling data reader: tokenisers, splits, gzip, token files, windows that are
//! a pure function of the seed, and clear errors for bad files.

use std::io::Write;
use std::path::{Path, PathBuf};

use runtime::{RuntimeError, TokenCorpus, TokenDtype, Tokenizer};

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

#[test]
fn byte_tokens_split_at_the_validation_fraction() {
    let dir = tempfile::tempdir().unwrap();
    let text = "abcdefghij";
    let path = write(dir.path(), "t.txt", text.as_bytes());
    let c = TokenCorpus::open_text(&path, false, 0.2).unwrap();
    assert_eq!(c.tokenizer, Tokenizer::Byte);
    assert_eq!((c.train.len(), c.val.len()), (8, 2));
    assert_eq!(c.train.vocab_size(), 256);
    let (inputs, targets) = c.val.read_rows(&[0], 1).unwrap();
    assert_eq!(
        (inputs, targets),
        (vec![u32::from(b'i')], vec![u32::from(b'j')])
    );
}

#[test]
fn char_tokens_use_the_distinct_characters_and_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let text = "héllo wörld";
    let path = write(dir.path(), "t.txt", text.as_bytes());
    let c = TokenCorpus::open_text(&path, true, 0.0).unwrap();
    let Tokenizer::Char { alphabet } = &c.tokenizer else {
        panic!("a char tokenizer")
    };
    let mut distinct: Vec<char> = text.chars().collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(alphabet, &distinct);
    assert_eq!(c.train.len(), text.chars().count() as u64);
    let (inputs, targets) = c.train.read_rows(&[0], 10).unwrap();
    assert_eq!(c.tokenizer.decode(&inputs), "héllo wörl");
    assert_eq!(c.tokenizer.decode(&targets), "éllo wörld");
    assert!(c.tokenizer.encode("z").is_err());
}

#[test]
fn gzip_text_reads_like_plain_text_and_bad_gzip_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let text = "In the beginning God created the heaven and the earth.\n".repeat(50);
    let plain = write(dir.path(), "t.txt", text.as_bytes());
    let gz = write(dir.path(), "t.txt.gz", &gzip(text.as_bytes()));
    let a = TokenCorpus::open_text(&plain, false, 0.1).unwrap();
    let b = TokenCorpus::open_text(&gz, false, 0.1).unwrap();
    let starts = a.train.window_starts(1, 1, 0, 8, 16).unwrap();
    assert_eq!(
        a.train.read_rows(&starts, 16).unwrap(),
        b.train.read_rows(&starts, 16).unwrap()
    );
    let bad = write(dir.path(), "bad.txt.gz", b"\x1f\x8bnot really gzip");
    let err = TokenCorpus::open_text(&bad, false, 0.1).unwrap_err();
    assert!(matches!(err, RuntimeError::Data { .. }), "{err}");
    assert!(err.to_string().contains("bad.txt.gz"), "{err}");
    let latin1 = write(dir.path(), "l.txt", b"caf\xe9");
    let err = TokenCorpus::open_text(&latin1, false, 0.1).unwrap_err();
    assert!(err.to_string().contains("not UTF-8"), "{err}");
}

/// `cat a.gz b.gz`, pigz and bgzip write several gzip members: all of them are the text.
#[test]
fn every_member_of_a_multi_member_gzip_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = ("abc abc abc\n".repeat(20), "xyz é xyz\n".repeat(20));
    let mut members = gzip(first.as_bytes());
    members.extend(gzip(second.as_bytes()));
    let gz = write(dir.path(), "two.txt.gz", &members);
    let whole = format!("{first}{second}");
    let c = TokenCorpus::open_text(&gz, true, 0.0).unwrap();
    assert_eq!(c.train.len(), whole.chars().count() as u64);
    let Tokenizer::Char { alphabet } = &c.tokenizer else {
        panic!("a char tokenizer")
    };
    assert!(
        alphabet.contains(&'z') && alphabet.contains(&'é'),
        "{alphabet:?}"
    );
    let all = c.train.len() as usize - 1;
    let (inputs, _) = c.train.read_rows(&[0], all).unwrap();
    assert_eq!(c.tokenizer.decode(&inputs), whole[..whole.len() - 1]);
}

#[test]
fn window_starts_are_a_pure_function_of_seed_epoch_and_step() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "t.txt", &[b'x'; 1000]);
    let c = TokenCorpus::open_text(&path, false, 0.1).unwrap();
    let s = |seed, epoch, step| c.train.window_starts(seed, epoch, step, 16, 32).unwrap();
    assert_eq!(s(1, 1, 3), s(1, 1, 3));
    assert_ne!(s(1, 1, 3), s(1, 1, 4));
    assert_ne!(s(1, 1, 3), s(1, 2, 3));
    assert_ne!(s(1, 1, 3), s(2, 1, 3));
    // Every window fits, and rows of one batch are independent of the batch size.
    let big = c.train.window_starts(1, 1, 3, 64, 32).unwrap();
    assert_eq!(&big[..16], &s(1, 1, 3)[..]);
    assert!(big.iter().all(|&x| x + 33 <= c.train.len()));
    // A rank reading rows 4..8 gets exactly those rows of the whole batch.
    let (all_in, _) = c.train.read_rows(&big, 32).unwrap();
    let (some_in, _) = c.train.read_rows(&big[4..8], 32).unwrap();
    assert_eq!(&all_in[4 * 32..8 * 32], &some_in[..]);
    // A split shorter than one window is an error.
    assert!(c.val.window_starts(1, 1, 0, 1, 200).is_err());
}

#[test]
fn token_files_are_read_by_window_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u16> = (0..100).map(|i| (i * 7 % 50) as u16).collect();
    let bytes: Vec<u8> = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
    let path = write(dir.path(), "t.bin", &bytes);
    let c = TokenCorpus::open_tokens(&path, TokenDtype::U16, Some(50), 0.1).unwrap();
    assert_eq!((c.train.len(), c.val.len()), (90, 10));
    let (inputs, targets) = c.train.read_rows(&[5], 4).unwrap();
    let want: Vec<u32> = ids[5..10].iter().map(|&x| u32::from(x)).collect();
    assert_eq!(inputs, want[..4]);
    assert_eq!(targets, want[1..]);
    let (val_in, _) = c.val.read_rows(&[0], 3).unwrap();
    assert_eq!(
        val_in,
        ids[90..93]
            .iter()
            .map(|&x| u32::from(x))
            .collect::<Vec<_>>()
    );
    // Ids beyond the vocabulary, odd lengths and impossible vocabularies are errors.
    let err = TokenCorpus::open_tokens(&path, TokenDtype::U16, Some(10), 0.1).unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    let odd = write(dir.path(), "odd.bin", &[1, 2, 3]);
    let err = TokenCorpus::open_tokens(&odd, TokenDtype::U16, Some(10), 0.1).unwrap_err();
    assert!(err.to_string().contains("odd.bin"), "{err}");
    assert!(TokenCorpus::open_tokens(&path, TokenDtype::U16, Some(70_000), 0.1).is_err());
    assert!(TokenCorpus::open_tokens(&path, TokenDtype::U32, Some(10), 1.0).is_err());
    assert!(c.train.read_rows(&[88], 4).is_err());
    // Without a vocabulary size, the scan finds one more than the largest id (49 here).
    let scanned = TokenCorpus::open_tokens(&path, TokenDtype::U16, None, 0.1).unwrap();
    assert_eq!(scanned.train.vocab_size(), 50);
}

/// A device (endless, `/dev/zero`) or a directory is refused at once, naming the path, with or
/// without a vocabulary size: the vocabulary scan used to read `/dev/zero` forever.
#[test]
fn a_token_file_that_is_not_a_regular_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for path in [Path::new("/dev/zero"), dir.path()] {
        for vocab in [None, Some(100)] {
            let err = TokenCorpus::open_tokens(path, TokenDtype::U16, vocab, 0.1).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains(&path.display().to_string()) && text.contains("not a regular file"),
                "{text}"
            );
        }
    }
}

#[test]
fn the_bundled_kjv_text_reads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/kjv/kjv.txt.gz");
    let c = TokenCorpus::open_text(&path, true, 0.1).unwrap();
    // The README: 4,153,207 bytes of ASCII, 73 distinct characters.
    assert_eq!(c.tokenizer.vocab_size(), 73);
    assert_eq!(c.train.len() + c.val.len(), 4_153_207);
    let (inputs, _) = c.train.read_rows(&[0], 9).unwrap();
    assert_eq!(c.tokenizer.decode(&inputs), "Genesis 1");
}

/// An id at or above `data.vocab_size` anywhere in a token file is found when the file is
/// opened, naming the token and its byte offset. It used to pass until a training window
/// happened to hold it (a run could train for hours first, or never notice it in the
/// validation split).
#[test]
fn a_token_id_outside_the_vocabulary_is_found_when_the_file_opens() {
    let dir = tempfile::tempdir().unwrap();
    let mut ids: Vec<u32> = (0..3000).map(|i| i % 50).collect();
    ids[2500] = 60_000;
    let bytes: Vec<u8> = ids.iter().flat_map(|x| (*x as u16).to_le_bytes()).collect();
    let path = write(dir.path(), "rare.bin", &bytes);
    let err = TokenCorpus::open_tokens(&path, TokenDtype::U16, Some(50), 0.1).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("rare.bin")
            && text.contains("token 2500 (byte offset 5000) has id 60000")
            && text.contains("data.vocab_size"),
        "{text}"
    );
    // The same with u32 ids past the vocabulary's last token, in the validation split.
    let mut ids32 = ids.clone();
    ids32[2500] = 0;
    ids32[2999] = 50;
    let bytes: Vec<u8> = ids32.iter().flat_map(|x| x.to_le_bytes()).collect();
    let path = write(dir.path(), "last.bin", &bytes);
    let err = TokenCorpus::open_tokens(&path, TokenDtype::U32, Some(50), 0.1).unwrap_err();
    assert!(
        err.to_string()
            .contains("token 2999 (byte offset 11996) has id 50"),
        "{err}"
    );
    assert!(TokenCorpus::open_tokens(&path, TokenDtype::U32, Some(51), 0.1).is_ok());
}

/// A device given as a text file is refused at once, naming it: `/dev/zero` used to be read
/// until the 2 GiB limit (or the memory) ran out.
#[test]
fn a_device_is_not_read_as_a_text_file() {
    for char_tokens in [false, true] {
        let path = Path::new("/dev/zero");
        let started = std::time::Instant::now();
        let err = TokenCorpus::open_text(path, char_tokens, 0.1)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/dev/zero") && err.contains("is a device"),
            "{err}"
        );
        assert!(started.elapsed().as_secs() < 5, "{err}");
    }
}

/// A file of 32-bit ids read with `data.dtype = "u16"` is refused naming the key: read as
/// 16-bit ids every other token is a high half (0, or small for vocabularies past 2^16), which
/// trained silently on a corrupted stream. The same file read as `u32`, and a 16-bit file of
/// the same ids, are accepted.
#[test]
fn a_file_of_32_bit_ids_read_as_16_bit_ones_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for vocab in [50_257u32, 128_256] {
        let ids: Vec<u32> = (0..4096u32).map(|i| (i * 7919) % vocab).collect();
        let wide: Vec<u8> = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
        let path = write(dir.path(), &format!("wide{vocab}.bin"), &wide);
        // (A vocabulary past 2^16 given with u16 ids is refused before the scan.)
        let givens = if vocab <= 1 << 16 {
            vec![None, Some(vocab as usize)]
        } else {
            vec![None]
        };
        for given in givens {
            let err = TokenCorpus::open_tokens(&path, TokenDtype::U16, given, 0.1);
            let text = err.map(|_| ()).unwrap_err().to_string();
            assert!(
                text.contains(&format!("wide{vocab}.bin")) && text.contains("data.dtype = \"u32\""),
                "{text}"
            );
        }
        let read = TokenCorpus::open_tokens(&path, TokenDtype::U32, None, 0.1).unwrap();
        assert_eq!(
            read.train.vocab_size(),
            *ids.iter().max().unwrap() as usize + 1
        );
        if vocab <= 1 << 16 {
            let narrow: Vec<u8> = ids.iter().flat_map(|x| (*x as u16).to_le_bytes()).collect();
            let path = write(dir.path(), "narrow.bin", &narrow);
            assert!(TokenCorpus::open_tokens(&path, TokenDtype::U16, None, 0.1).is_ok());
        }
    }
}

/// A model too large because of one stray huge id in a token file with no `data.vocab_size`
/// is an error naming the file and the key, not only the model's settings (the vocabulary is
/// scanned from the file: one more than its largest id).
#[test]
fn a_vocabulary_scanned_from_a_stray_id_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut ids: Vec<u32> = (0..5000).map(|i| i % 50).collect();
    ids[100] = 3_000_000_000;
    let bytes: Vec<u8> = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
    let path = write(dir.path(), "stray.bin", &bytes);
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/gpt_kjv.toml");
    let sets = |extra: &[&str]| -> Vec<String> {
        let mut sets = vec![
            "data.format=\"tokens\"".to_string(),
            "data.dtype=\"u32\"".to_string(),
            format!("data.path={:?}", path.display().to_string()),
            format!(
                "output.dir={:?}",
                dir.path().join("out").display().to_string()
            ),
        ];
        sets.extend(extra.iter().map(|s| s.to_string()));
        sets
    };
    let config = runtime::TrainConfig::load(&example, &sets(&[])).unwrap();
    let keys = config.data().text.clone().unwrap();
    let data = runtime::TextData::open(&config, &keys).unwrap();
    let text = data.gpt_config(&config).unwrap_err().to_string();
    assert!(
        text.contains("stray.bin")
            && text.contains("data.vocab_size")
            && text.contains("3000000001"),
        "{text}"
    );
    // A model too large whatever the vocabulary stays the model's error.
    let config = runtime::TrainConfig::load(&example, &sets(&["model.hidden=65536"])).unwrap();
    let data = runtime::TextData::open(&config, &config.data().text.clone().unwrap()).unwrap();
    let text = data.gpt_config(&config).unwrap_err().to_string();
    assert!(
        text.contains("element bound") && !text.contains("data.vocab_size"),
        "{text}"
    );
    // With the key set, the id itself is the error, naming the token.
    let config = runtime::TrainConfig::load(&example, &sets(&["data.vocab_size=50"])).unwrap();
    let keys = config.data().text.clone().unwrap();
    let text = runtime::TextData::open(&config, &keys)
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("token 100") && text.contains("stray.bin"),
        "{text}"
    );
}

/// A text or a gzip given as a token file (`data.format = "tokens"` pointed at the bundled
/// `kjv.txt.gz`) is refused naming the file and `data.format`: read as ids, its bytes trained
/// silently on garbage.
#[test]
fn a_text_or_gzip_given_as_a_token_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let kjv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/kjv/kjv.txt.gz");
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(&kjv).unwrap()),
        &mut text,
    )
    .unwrap();
    let plain = write(dir.path(), "kjv.txt", &text.as_bytes()[..100_000]);
    for (path, what) in [(&kjv, "is a gzip file"), (&plain, "looks like text")] {
        for dtype in [TokenDtype::U16, TokenDtype::U32] {
            let err = TokenCorpus::open_tokens(path, dtype, None, 0.1).map(|_| ());
            let text = err.unwrap_err().to_string();
            assert!(
                text.contains(&path.display().to_string())
                    && text.contains(what)
                    && text.contains("data.format = \"text\""),
                "{text}"
            );
        }
    }
    // Token files whose ids fill every byte value are read, 16-bit and 32-bit alike.
    let ids: Vec<u32> = (0..40_000u32)
        .map(|i| i.wrapping_mul(2_654_435_761) >> 16)
        .collect();
    let narrow: Vec<u8> = ids.iter().flat_map(|x| (*x as u16).to_le_bytes()).collect();
    let path = write(dir.path(), "ids.bin", &narrow);
    assert!(TokenCorpus::open_tokens(&path, TokenDtype::U16, None, 0.1).is_ok());
    let wide: Vec<u8> = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
    let path = write(dir.path(), "ids32.bin", &wide);
    assert!(TokenCorpus::open_tokens(&path, TokenDtype::U32, None, 0.1).is_ok());
}
