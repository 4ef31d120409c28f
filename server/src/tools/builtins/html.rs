//! HTML to readable text: the title, then the visible text of the body as `html2text` renders
//! it (scripts, styles and the head left out, block elements on their own lines, entities
//! decoded), with whitespace tidied.

/// Lines are not wrapped: the reader (a model, or a summary) wraps for itself.
const NO_WRAP: usize = 100_000;

/// Literal text only: no Markdown-style marks for headings, lists or links.
fn plain() -> html2text::config::Config<html2text::render::TrivialDecorator> {
    html2text::config::with_decorator(html2text::render::TrivialDecorator::new())
}

pub fn html_to_text(html: &str) -> (Option<String>, String) {
    let text = plain().string_from_read(html.as_bytes(), NO_WRAP).unwrap_or_default();
    let lines: Vec<String> = text.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).filter(|l| !l.is_empty()).collect();
    (title(html), lines.join("\n"))
}

/// The document's `<title>`, decoded.
fn title(html: &str) -> Option<String> {
    let lower = html.to_ascii_lowercase();
    let start = lower.find("<title")?;
    let open_end = lower[start..].find('>')? + start + 1;
    let close = lower[open_end..].find("</title")? + open_end;
    let inner = &html[open_end..close];
    let decoded = plain().string_from_read(format!("<p>{inner}</p>").as_bytes(), NO_WRAP).unwrap_or_default();
    Some(decoded.split_whitespace().collect::<Vec<_>>().join(" ")).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    #[test]
    fn readable_text_and_title() {
        let (title, text) = super::html_to_text(
            "<html><head><title>Opening hours &amp; prices</title><style>p{}</style></head><body><h1>Hours</h1><p>Mon&nbsp;9&ndash;5</p><script>alert(1)</script><ul><li>Tea</li><li>Cake</li></ul></body></html>",
        );
        assert_eq!(title.as_deref(), Some("Opening hours & prices"));
        insta::assert_snapshot!(text, @r"
        Hours
        Mon 9–5
        Tea
        Cake
        ");
    }

    #[test]
    fn a_header_element_is_content_not_the_head() {
        let (_, text) = super::html_to_text("<html><head><title>T</title></head><body><header>Shop name and phone</header><p>Body</p></body></html>");
        assert!(text.contains("Shop name and phone") && text.contains("Body"), "{text}");
    }
}
