//! The plan, the wire's bodies and the hostfile checks, without a group (engine/tests/shard.rs
//! runs real groups of processes on loopback).

use super::plan::Plan;
use super::wire::Forward;
use super::Hostfile;
use crate::model::remote::SlotOp;

#[test]
fn the_plan_balances_bytes_and_gives_rank_0_fewer_layers_for_its_head() {
    // 24 equal layers of 60 and an embedding of 540 on rank 0: half of 1980 is 990, which
    // lies between 7 layers (960) and 8 (1020), as near to each; the first of equals wins.
    let plan = Plan::balance(&[60; 24], 540, 2).unwrap();
    assert_eq!(plan.starts, vec![0, 7, 24]);
    let three = Plan::balance(&[60; 24], 540, 3).unwrap();
    assert_eq!(three.starts, vec![0, 2, 13, 24]);
    // Nothing extra: an even split.
    assert_eq!(Plan::balance(&[1; 4], 0, 2).unwrap().starts, vec![0, 2, 4]);
}

#[test]
fn every_rank_after_0_gets_a_layer_even_when_the_head_outweighs_them_all() {
    let plan = Plan::balance(&[1, 1], 1000, 3).unwrap();
    assert_eq!(plan.starts, vec![0, 0, 1, 2]);
    assert_eq!(plan.range(0), 0..0);
    assert!(Plan::balance(&[1, 1], 0, 4).is_err(), "3 workers for 2 layers");
}

#[test]
fn a_plan_from_the_wire_is_checked() {
    let plan = Plan::balance(&[5; 6], 3, 3).unwrap();
    assert_eq!(Plan::from_words(&plan.words()), Some(plan));
    assert_eq!(Plan::from_words(&[0, 0, 2]), Some(Plan { starts: vec![0, 0, 2] }));
    for bad in [&[0, 2, 2][..], &[1, 2, 3], &[0, 3, 2], &[0, -1, 2], &[0, 2]] {
        assert_eq!(Plan::from_words(bad), None, "{bad:?}");
    }
}

#[test]
fn a_forward_body_round_trips_and_a_damaged_one_is_refused() {
    let f = Forward {
        lens: vec![3, 1],
        slots: vec![vec![(1, 0), (2, 0)], vec![(3, 7), (4, 7)]],
        ops: vec![
            SlotOp::Clone { layer: 1, from: 5, to: 6 },
            SlotOp::Trim { layer: 2, slot: 6, n: 2 },
            SlotOp::Free { layer: 1, slot: 5 },
        ],
    };
    let words = f.words();
    assert_eq!(Forward::from_words(&words), Some(f));
    assert_eq!(Forward::from_words(&words[..words.len() - 1]), None);
    let mut unknown_op = words.clone();
    let at = words.len() - 4;
    unknown_op[at] = 9;
    assert_eq!(Forward::from_words(&unknown_op), None);
    assert_eq!(Forward::from_words(&[i32::MAX, i32::MAX, i32::MAX]), None);
    assert_eq!(Forward::from_words(&[]), None);
}

#[test]
fn a_hostfile_is_mlx_rings_format_or_a_clear_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let write = |text: &str| {
        let p = dir.path().join("hosts.json");
        std::fs::write(&p, text).unwrap();
        p
    };
    let ok = Hostfile::read(&write(r#"[["127.0.0.1:5000"], ["10.0.0.2:5000", "10.0.1.2:5000"]]"#));
    assert_eq!(ok.unwrap().ranks.len(), 2);
    for (text, says) in [
        (r#"[["127.0.0.1:5000"]]"#, "names 1 ranks"),
        (r#"[["127.0.0.1:5000"], []]"#, "rank 1 has no address"),
        (r#"[["127.0.0.1:5000"], ["mac-two:5000"]]"#, "`mac-two:5000` is not an ip:port"),
        (r#"{"hosts": []}"#, "not MLX's ring format"),
        (r#"[{"ssh": "a", "ips": ["1.2.3.4"]}]"#, "not MLX's ring format"),
    ] {
        let err = Hostfile::read(&write(text)).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains(says), "{text}: {err}");
    }
    let missing = Hostfile::read(&dir.path().join("nope.json")).err().unwrap().to_string();
    assert!(missing.contains("nope.json"), "{missing}");
}

#[test]
fn a_remote_cache_queues_what_its_rank_must_repeat_and_counts_what_it_holds_there() {
    use crate::model::kv_cache::KvCache;
    use crate::model::remote::SlotBook;
    let book = std::sync::Arc::new(SlotBook::default());
    let mut cache = KvCache::new();
    assert_eq!(cache.nbytes(), 0);
    let slot = cache.remote_slot(3, 100, &book);
    assert_eq!(cache.remote_slot(3, 100, &book), slot, "a slot is given once");
    cache.advance_remote(10);
    // Held remotely in steps of 256 positions, as a local cache grows.
    assert_eq!(cache.nbytes(), 256 * 100);
    let mut copy = cache.clone();
    assert_eq!(copy.trim(4), 4);
    assert_eq!((copy.offset(), cache.offset()), (6, 10));
    drop(copy);
    let ops = book.take_pending();
    let to = match ops[0] {
        SlotOp::Clone { layer: 3, from, to } if from == slot => to,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        &ops[1..],
        &[SlotOp::Trim { layer: 3, slot: to, n: 4 }, SlotOp::Free { layer: 3, slot: to }]
    );
    assert!(book.take_pending().is_empty(), "taken once");
}

#[test]
fn a_short_body_rides_in_the_header_and_a_long_one_follows_it() {
    use super::wire::{inline_body, pack};
    let fixed = [3, 0, 1, 1, 1, 896, 10, 0];
    for n in [0usize, 1, 46, 248, 249, 5000] {
        let body: Vec<i32> = (0..n as i32).collect();
        let (head, rest) = pack([fixed[0], n as i32, 1, 1, 1, 896, 10, 0], &body);
        assert_eq!(head.len(), 256, "the header's array has one size, so it can be received");
        match (inline_body(&head), rest) {
            (Some(inline), None) => assert_eq!(inline, &body[..], "{n} words inline"),
            (None, Some(rest)) => {
                assert!(n > 248, "{n} words went apart");
                assert_eq!(rest, &body[..]);
            }
            other => panic!("{n} words: {other:?}"),
        }
    }
}

#[test]
fn a_header_asking_for_too_much_is_refused_before_anything_is_allocated() {
    use super::wire::header_fits;
    let header = |words: i32, shape: [i32; 3]| [3, words, 1, shape[0], shape[1], shape[2], 10, 0];
    assert!(header_fits(&header(46, [1, 1, 896])));
    assert!(header_fits(&header(0, [1, 8192, 32768])), "a long step of a wide model");
    assert!(!header_fits(&header(-1, [1, 1, 896])));
    assert!(!header_fits(&header(46, [1, -1, 896])));
    assert!(!header_fits(&header(1 << 25, [1, 1, 896])));
    // Each dimension within bounds, their product far past them.
    assert!(!header_fits(&header(46, [1 << 20, 1 << 20, 1 << 20])));
    assert!(!header_fits(&header(46, [2, 8192, 32768])));
}
