//! HTML to readable text: the title, then the visible text with scripts, styles and tags
//! removed, block elements as line breaks, common entities decoded, whitespace tidied.

pub fn html_to_text(html: &str) -> (Option<String>, String) {
    let lower = html.to_ascii_lowercase();
    let title = lower.find("<title").and_then(|start| {
        let open_end = lower[start..].find('>')? + start + 1;
        let close = lower[open_end..].find("</title")? + open_end;
        Some(decode(html[open_end..close].trim())).filter(|t| !t.is_empty())
    });
    let mut out = String::with_capacity(html.len() / 2);
    let mut i = 0;
    let bytes = html.as_bytes();
    while i < bytes.len() {
        if bytes[i] == b'<' {
            let rest = &lower[i..];
            // Skip whole elements whose content is not text.
            if let Some(tag) = ["script", "style", "noscript", "template", "head"].iter().find(|t| rest[1..].starts_with(**t)) {
                let close = format!("</{tag}");
                i = rest.find(&close).and_then(|c| rest[c..].find('>').map(|e| i + c + e + 1)).unwrap_or(bytes.len());
                continue;
            }
            let end = rest.find('>').map_or(bytes.len(), |e| i + e + 1);
            let name: String = rest[1..].trim_start_matches('/').chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
            if matches!(name.as_str(), "p" | "div" | "br" | "li" | "tr" | "h1" | "h2" | "h3" | "h4" | "h5" | "h6" | "section" | "article" | "header" | "footer" | "table" | "ul" | "ol" | "pre" | "blockquote") {
                out.push('\n');
            } else {
                out.push(' ');
            }
            i = end;
        } else {
            let next = html[i..].find('<').map_or(bytes.len(), |n| i + n);
            out.push_str(&html[i..next]);
            i = next;
        }
    }
    let text = decode(&out);
    let lines: Vec<String> = text.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).filter(|l| !l.is_empty()).collect();
    (title, lines.join("\n"))
}

fn decode(s: &str) -> String {
    let mut out = s.replace("&nbsp;", " ").replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&#39;", "'").replace("&apos;", "'");
    out = out.replace("&amp;", "&");
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn readable_text_and_title() {
        let (title, text) = super::html_to_text(
            "<html><head><title>Opening hours &amp; prices</title><style>p{}</style></head><body><h1>Hours</h1><p>Mon&nbsp;9&ndash;5</p><script>alert(1)</script><ul><li>Tea</li><li>Cake</li></ul></body></html>",
        );
        assert_eq!(title.as_deref(), Some("Opening hours & prices"));
        assert!(text.contains("Hours\nMon 9&ndash;5\nTea\nCake"), "{text}");
        assert!(!text.contains("alert") && !text.contains("p{}"), "{text}");
    }
}
