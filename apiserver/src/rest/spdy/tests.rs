use super::*;

fn headers(pairs: &[(&str, &str)]) -> Headers {
    pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
}

/// Everything `encoder` writes for `frames`, fed to a decoder `step`
/// bytes at a time, as a tunnel that splits frames anywhere would.
fn round_trip(frames: &[Frame], step: usize) -> Vec<Frame> {
    let mut encoder = Encoder::default();
    let bytes: Vec<u8> = frames.iter().flat_map(|f| encoder.encode(f)).collect();
    let mut decoder = Decoder::default();
    let mut out = Vec::new();
    for chunk in bytes.chunks(step) {
        decoder.push(chunk);
        while let Some(frame) = decoder.next_frame().expect("well-formed") {
            out.push(frame);
        }
    }
    out
}

#[test]
fn the_dictionary_is_spdy3s_by_its_id() {
    assert_eq!(DICTIONARY.len(), 1423);
    let mut deflate = Compress::new(Compression::default(), true);
    // zlib answers the dictionary's Adler-32, which SPDY/3 fixes.
    assert_eq!(deflate.set_dictionary(DICTIONARY).unwrap(), 0xe3c6_a7c2);
}

#[test]
fn frames_survive_any_split_and_header_blocks_share_one_context() {
    let frames = vec![
        Frame::SynStream {
            stream: 1,
            headers: headers(&[("streamtype", "error"), ("port", "80"), ("requestid", "0")]),
            fin: false,
        },
        Frame::Data { stream: 1, fin: true, data: Bytes::new() },
        // The second block reuses the first's history: only one shared
        // inflate context decodes it.
        Frame::SynStream {
            stream: 3,
            headers: headers(&[("streamtype", "data"), ("port", "80"), ("requestid", "0")]),
            fin: false,
        },
        Frame::Data { stream: 3, fin: false, data: Bytes::from_static(b"GET / HTTP/1.1\r\n\r\n") },
        Frame::SynReply { stream: 3, headers: Vec::new(), fin: false },
        Frame::Ping(7),
        Frame::RstStream { stream: 3, status: 5 },
        Frame::GoAway { last_stream: 0, status: 0 },
    ];
    for step in [1, 2, 3, 7, 51, 4096] {
        assert_eq!(round_trip(&frames, step), frames, "split every {step} bytes");
    }
}

#[test]
fn repeated_header_values_travel_joined_by_nul_and_names_are_lower_cased() {
    let sent = vec![Frame::SynStream { stream: 5, headers: headers(&[("RequestID", "a\0b")]), fin: true }];
    let got = round_trip(&sent, 10);
    assert_eq!(
        got,
        vec![Frame::SynStream { stream: 5, headers: headers(&[("requestid", "a"), ("requestid", "b")]), fin: true }]
    );
    assert_eq!(header(&headers(&[("port", "80")]), "port"), Some("80"));
}

#[test]
fn large_data_frames_keep_their_bytes() {
    let frames = vec![Frame::Data { stream: 3, fin: true, data: Bytes::from(vec![7u8; 70_000]) }];
    assert_eq!(round_trip(&frames, 1000), frames);
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    // A control frame of version 2.
    let mut decoder = Decoder::default();
    decoder.push(&[0x80, 0x02, 0x00, 0x06, 0, 0, 0, 4, 0, 0, 0, 1]);
    assert!(matches!(decoder.next_frame(), Err(SpdyError::Version(2))));
    // A PING too short for its id.
    let mut decoder = Decoder::default();
    decoder.push(&[0x80, 0x03, 0x00, 0x06, 0, 0, 0, 2, 0, 1]);
    assert!(matches!(decoder.next_frame(), Err(SpdyError::Malformed("PING"))));
    // A SYN_STREAM whose header block is not zlib.
    let mut decoder = Decoder::default();
    decoder.push(&[0x80, 0x03, 0x00, 0x01, 0, 0, 0, 14, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef]);
    assert!(matches!(decoder.next_frame(), Err(SpdyError::Headers(_))));
    // Half a frame is no frame yet.
    let mut decoder = Decoder::default();
    decoder.push(&[0, 0, 0, 1, 0, 0, 0]);
    assert!(matches!(decoder.next_frame(), Ok(None)));
}
