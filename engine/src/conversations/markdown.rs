//! A conversation as Markdown a person reads (the branch shown, one `## Role` heading per
//! message), and back. A message line that looks like a role heading is written with a
//! backslash before it, so an export reads back as the same messages.

use super::{Conversation, Message, Role};

const ROLES: [Role; 4] = [Role::System, Role::User, Role::Assistant, Role::Tool];

fn heading_role(line: &str) -> Option<Role> {
    let h = line.strip_prefix("## ")?.trim();
    ROLES.into_iter().find(|r| r.heading().eq_ignore_ascii_case(h))
}

/// Whether `line` needs its escape: a heading (or an already escaped one, so that the
/// backslash itself survives).
fn needs_escape(line: &str) -> bool {
    let bare = line.trim_start_matches('\\');
    heading_role(bare).is_some()
}

fn escape(text: &str) -> String {
    text.lines()
        .map(|l| if needs_escape(l) { format!("\\{l}") } else { l.to_string() })
        .collect::<Vec<_>>()
        .join("\n")
}

fn unescape(line: &str) -> &str {
    match line.strip_prefix('\\') {
        Some(rest) if needs_escape(rest) => rest,
        _ => line,
    }
}

/// The branch shown, as Markdown: the title, the system prompt, then each message.
/// Reasoning is folded into a `<details>` block; tool calls are fenced JSON.
pub fn export(c: &Conversation) -> String {
    let mut out = format!("# {}\n", c.title.lines().next().unwrap_or("").trim());
    let mut part = |role: Role, body: &str| {
        out.push_str(&format!("\n## {}\n\n{}\n", role.heading(), escape(body)));
    };
    if !c.settings.system.is_empty() {
        part(Role::System, &c.settings.system);
    }
    for m in c.branch() {
        let mut body = String::new();
        if !m.reasoning.is_empty() {
            body.push_str(&format!(
                "<details><summary>Reasoning</summary>\n\n{}\n\n</details>\n\n",
                m.reasoning
            ));
        }
        body.push_str(&m.content);
        for a in &m.attachments {
            body.push_str(&format!("\n\n(attached: {})", a.name));
        }
        for call in &m.tool_calls {
            body.push_str(&format!(
                "\n\n```json\n{{\"tool_call\": {}, \"arguments\": {}}}\n```",
                serde_json::to_string(&call.name).unwrap_or_default(),
                serde_json::to_string(&call.arguments).unwrap_or_default()
            ));
        }
        part(m.role, body.trim_start());
    }
    out
}

/// Markdown (ours, or any text with `## User` / `## Assistant` / `## System` / `## Tool`
/// headings) as a new conversation: one chain of messages, the first `# ` line as title,
/// a leading system part as the system prompt. Text before the first heading is refused
/// when it is more than a title, so nothing is dropped silently.
pub fn import(text: &str) -> Result<Conversation, super::Invalid> {
    let mut c = Conversation::new("Imported chat");
    let mut parts: Vec<(Role, Vec<&str>)> = vec![];
    for line in text.lines() {
        if let Some(role) = heading_role(line) {
            parts.push((role, vec![]));
            continue;
        }
        match parts.last_mut() {
            Some((_, lines)) => lines.push(unescape(line)),
            None if line.trim().is_empty() => {}
            None => match line.strip_prefix("# ") {
                Some(t) if c.title == "Imported chat" => c.title = t.trim().chars().take(super::MAX_TITLE_CHARS).collect(),
                _ => {
                    return Err(super::invalid(
                        "markdown",
                        "text before the first `## User` / `## Assistant` heading (only a `# Title` line may come first)",
                    ))
                }
            },
        }
    }
    if parts.is_empty() {
        return Err(super::invalid(
            "markdown",
            "no `## User` or `## Assistant` heading: nothing to import",
        ));
    }
    let mut parent: Option<String> = None;
    for (i, (role, lines)) in parts.into_iter().enumerate() {
        // One blank line follows a heading and precedes the next; the text between is kept.
        let body = lines.join("\n");
        let body = body.strip_prefix('\n').unwrap_or(&body);
        let body = body.strip_suffix('\n').unwrap_or(body).to_string();
        if i == 0 && role == Role::System {
            c.settings.system = body;
            continue;
        }
        let id = format!("m{i}");
        c.messages.push(Message {
            id: id.clone(),
            parent: parent.replace(id.clone()),
            role,
            content: body,
            reasoning: String::new(),
            tool_calls: vec![],
            tool_call_id: None,
            attachments: vec![],
            stats: None,
            error: None,
            created_ms: 0,
        });
    }
    c.current = parent;
    c.check()?;
    Ok(c)
}
