use super::*;

fn msg(id: &str, parent: Option<&str>, role: Role, content: &str) -> Message {
    Message {
        id: id.into(),
        parent: parent.map(String::from),
        role,
        content: content.into(),
        reasoning: String::new(),
        tool_calls: vec![],
        tool_call_id: None,
        attachments: vec![],
        stats: None,
        error: None,
        created_ms: 0,
    }
}

/// A chat whose first answer was regenerated: two branches under one question.
fn branched() -> Conversation {
    let mut c = Conversation::new("Rust question");
    c.messages = vec![
        msg("q", None, Role::User, "What is a lifetime?"),
        msg("a1", Some("q"), Role::Assistant, "First answer"),
        msg("a2", Some("q"), Role::Assistant, "Second answer"),
        msg("q2", Some("a2"), Role::User, "And 'static?"),
    ];
    c.current = Some("q2".into());
    c
}

#[test]
fn the_branch_shown_runs_from_the_first_message_to_current() {
    let mut c = branched();
    let ids = |c: &Conversation| c.branch().iter().map(|m| m.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&c), ["q", "a2", "q2"]);
    c.current = Some("a1".into());
    assert_eq!(ids(&c), ["q", "a1"]);
}

#[test]
fn a_conversation_that_is_not_a_tree_is_refused_by_field() {
    let mut c = branched();
    c.messages[1].parent = Some("q2".into()); // a later message: a cycle would be possible
    assert_eq!(c.check().unwrap_err().field, "messages[1].parent");
    let mut c = branched();
    c.messages[2].id = "a1".into();
    assert_eq!(c.check().unwrap_err().field, "messages[2].id");
    let mut c = branched();
    c.current = Some("gone".into());
    assert_eq!(c.check().unwrap_err().field, "current");
    let mut c = branched();
    c.messages[0].id = "../x".into();
    assert_eq!(c.check().unwrap_err().field, "messages[0].id");
    assert!(ConversationId::parse("../etc/passwd").is_err());
    assert!(ConversationId::parse("").is_err());
    assert!(ConversationId::parse(&"a".repeat(65)).is_err());
}

#[test]
fn unknown_fields_are_refused_with_their_path() {
    let v = serde_json::json!({"id": "c1", "messages": [{"id": "m", "role": "user", "colour": 1}]});
    let e = serde_path_to_error::deserialize::<_, Conversation>(v).unwrap_err();
    assert!(e.path().to_string().starts_with("messages[0]"), "{}", e.path());
    assert!(e.to_string().contains("colour"), "{e}");
}

#[test]
fn saves_check_the_revision_and_survive_a_new_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().join("chats"));
    let saved = store.put(branched()).unwrap();
    assert_eq!(saved.revision, 1);
    // Another window saves on top of revision 1; this one's copy is now stale.
    let mut other = saved.clone();
    other.title = "Renamed elsewhere".into();
    let other = store.put(other).unwrap();
    assert_eq!(other.revision, 2);
    match store.put(saved.clone()) {
        Err(ConversationError::Conflict { stored: 2, given: 1, .. }) => {}
        r => panic!("a stale save must be refused: {r:?}"),
    }
    // A fresh store over the same folder (a restart) reads what was saved.
    let again = Store::new(dir.path().join("chats"));
    assert_eq!(again.get(&saved.id).unwrap(), other);
    // No temporary file is left beside it.
    let names: Vec<_> = std::fs::read_dir(dir.path().join("chats"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, [format!("{}.json", saved.id)]);
}

#[test]
fn the_list_is_newest_first_and_search_finds_message_text() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().to_path_buf());
    let a = store.put(branched()).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let mut b = Conversation::new("Shopping");
    b.messages = vec![msg("m", None, Role::User, "Buy MILK and bread for the weekend")];
    let b = store.put(b).unwrap();
    let (all, damaged) = store.list(None).unwrap();
    assert!(damaged.is_empty());
    assert_eq!(all.iter().map(|s| &s.id).collect::<Vec<_>>(), [&b.id, &a.id]);
    let (hits, _) = store.list(Some("milk")).unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].snippet.as_deref(), Some("Buy MILK and bread for the weekend"));
    // A rename shows at once, though the list keeps summaries between calls.
    std::thread::sleep(std::time::Duration::from_millis(5));
    store.rename(&a.id, "Lifetimes").unwrap();
    let (all, _) = store.list(None).unwrap();
    assert_eq!(all.iter().map(|s| s.title.as_str()).collect::<Vec<_>>(), ["Lifetimes", "Shopping"]);
    let (hits, _) = store.list(Some("SECOND answer")).unwrap();
    assert_eq!(hits.iter().map(|s| &s.id).collect::<Vec<_>>(), [&a.id], "every branch is searched");
}

#[test]
fn a_damaged_file_is_reported_kept_and_deletable() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().to_path_buf());
    let good = store.put(branched()).unwrap();
    std::fs::write(dir.path().join("broken.json"), b"{\"id\": \"broken\", \"messages\": [")
        .unwrap();
    // Another conversation's content under this name is not taken for this one.
    let mut other = std::fs::read(dir.path().join(format!("{}.json", good.id))).unwrap();
    std::fs::write(dir.path().join("renamed.json"), &other).unwrap();
    other.clear();
    let (all, damaged) = store.list(None).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(damaged.len(), 2, "{damaged:?}");
    let id = ConversationId::parse("broken").unwrap();
    let mut c = Conversation::new("x");
    c.id = id.clone();
    assert!(matches!(store.put(c), Err(ConversationError::Damaged { .. })), "never overwritten");
    assert!(std::fs::read(dir.path().join("broken.json")).unwrap().ends_with(b"["));
    store.delete(&id).unwrap();
    assert_eq!(store.list(None).unwrap().1.len(), 1);
}

#[test]
fn markdown_reads_back_as_the_same_messages() {
    let mut c = branched();
    c.settings.system = "Be brief.".into();
    // Lines that look like headings, and their escaped forms, inside a message.
    c.messages[1].content = "## User\n\\## Assistant\n\n```\n## Tool\n```\nend".into();
    c.messages[3].parent = Some("a1".into());
    let md = markdown::export(&c);
    assert!(md.starts_with("# Rust question\n\n## System\n\nBe brief.\n\n## User\n"), "{md}");
    assert!(!md.contains("Second answer"), "only the branch shown is exported");
    let back = markdown::import(&md).unwrap();
    assert_eq!(back.title, "Rust question");
    assert_eq!(back.settings.system, "Be brief.");
    let shown: Vec<_> = c.branch().iter().map(|m| (m.role, m.content.clone())).collect();
    let read: Vec<_> = back.branch().iter().map(|m| (m.role, m.content.clone())).collect();
    assert_eq!(read, shown);
}

#[test]
fn markdown_without_headings_or_with_stray_text_is_refused() {
    assert_eq!(markdown::import("just some text").unwrap_err().field, "markdown");
    assert_eq!(markdown::import("# T\nintro\n## User\nhi").unwrap_err().field, "markdown");
    let c = markdown::import("# T\n\n## user\n\nhi\n\n## ASSISTANT\n\nhello").unwrap();
    assert_eq!(c.branch().len(), 2);
}

#[test]
fn presets_are_named_replaced_deleted_and_never_listed_as_chats() {
    use presets::{Preset, PresetError};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().to_path_buf());
    let preset = |name: &str, temperature: f64| Preset {
        name: name.into(),
        settings: ChatSettings {
            system: format!("You are {name}."),
            temperature: Some(temperature),
            ..ChatSettings::default()
        },
    };
    assert!(store.presets().list().unwrap().is_empty());
    store.presets().put(preset("Precise", 0.2)).unwrap();
    let all = store.presets().put(preset(" coder ", 0.1)).unwrap();
    let names = |all: &[Preset]| all.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&all), ["coder", "Precise"], "trimmed, sorted by name");
    // The same name, case aside, replaces.
    let all = store.presets().put(preset("PRECISE", 0.3)).unwrap();
    assert_eq!(names(&all), ["coder", "PRECISE"]);
    assert_eq!(all[1].settings.temperature, Some(0.3));
    let file = std::fs::read_to_string(dir.path().join(presets::FILE)).unwrap();
    assert!(file.contains("\"temperature\": 0.3,"), "written as given: {file}");
    // A new store over the folder reads the same; the file is no conversation.
    let again = Store::new(dir.path().to_path_buf());
    assert_eq!(again.presets().list().unwrap(), all);
    let (chats, damaged) = again.list(None).unwrap();
    assert!(chats.is_empty() && damaged.is_empty(), "{chats:?} {damaged:?}");
    assert!(ConversationId::parse("presets").is_err());
    // Refusals name the field.
    for bad in ["", "   ", "a\u{7}b", &"x".repeat(61)] {
        match store.presets().put(preset(bad, 1.0)) {
            Err(PresetError::Invalid(i)) => assert_eq!(i.field, "name"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert!(matches!(store.presets().delete("nope"), Err(PresetError::NotFound(_))));
    assert_eq!(names(&store.presets().delete("Coder").unwrap()), ["PRECISE"]);
    // A damaged file is reported and kept: a save does not write over it.
    let file = dir.path().join(presets::FILE);
    std::fs::write(&file, "{\"presets\": [{\"name\": \"x\", \"colour\": 1}]}").unwrap();
    assert!(matches!(store.presets().list(), Err(PresetError::Damaged { .. })));
    assert!(matches!(store.presets().put(preset("y", 1.0)), Err(PresetError::Damaged { .. })));
    assert!(std::fs::read_to_string(&file).unwrap().contains("colour"));
}
