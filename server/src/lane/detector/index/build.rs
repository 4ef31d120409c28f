//! Building the index: every field of every tool analysed once, weighted, saturated and
//! posted; idf from the catalog (or `idf_min_docs`, whichever is larger).

use std::collections::HashMap;

use crate::config::DetectorSettings;

use super::{Entry, FIELDS, Field, Inverted, prefix};
use crate::lane::detector::{ToolDoc, text::Analyzer};

impl Inverted {
    pub fn build(docs: Vec<ToolDoc>, analyzer: &Analyzer, settings: &DetectorSettings) -> Self {
        let mut vocab: HashMap<String, u32> = HashMap::new();
        let intern = |stem: String, vocab: &mut HashMap<String, u32>| {
            let next = vocab.len() as u32;
            *vocab.entry(stem).or_insert(next)
        };
        let w = &settings.weights;
        let weights = [
            w.name,
            w.title,
            w.aliases,
            w.triggers,
            w.tags,
            w.description,
            w.when_to_use,
            w.param_names,
            w.param_descriptions,
        ];

        // Terms of every field of every doc.
        let mut fields_of: Vec<[Vec<u32>; FIELDS]> = Vec::with_capacity(docs.len());
        let mut negatives: Vec<Vec<u32>> = Vec::with_capacity(docs.len());
        let mut entries = Vec::with_capacity(docs.len());
        let mut bigrams: HashMap<(u32, u32), Vec<u32>> = HashMap::new();
        let mut phrases: HashMap<String, Vec<(u32, Vec<String>)>> = HashMap::new();
        for (doc_id, doc) in docs.into_iter().enumerate() {
            let mut fields: [Vec<u32>; FIELDS] = Default::default();
            let mut add = |field: Field, text: &str, vocab: &mut HashMap<String, u32>| {
                let ids: Vec<u32> = analyzer
                    .terms(text)
                    .into_iter()
                    .map(|t| intern(t, vocab))
                    .collect();
                if matches!(
                    field,
                    Field::Name
                        | Field::Title
                        | Field::Aliases
                        | Field::Triggers
                        | Field::Description
                        | Field::WhenToUse
                ) {
                    for pair in ids.windows(2) {
                        let docs = bigrams.entry((pair[0], pair[1])).or_default();
                        if docs.last() != Some(&(doc_id as u32)) {
                            docs.push(doc_id as u32);
                        }
                    }
                }
                fields[field as usize].extend(ids);
            };
            add(Field::Name, &doc.name, &mut vocab);
            add(Field::Title, &doc.title, &mut vocab);
            for alias in &doc.aliases {
                add(Field::Aliases, alias, &mut vocab);
            }
            for trigger in &doc.triggers {
                add(Field::Triggers, trigger, &mut vocab);
            }
            for tag in &doc.tags {
                add(Field::Tags, tag, &mut vocab);
            }
            add(Field::Description, &doc.description, &mut vocab);
            add(Field::WhenToUse, &doc.when_to_use, &mut vocab);
            for param in &doc.params {
                add(Field::ParamNames, &param.name, &mut vocab);
                add(Field::ParamDescriptions, &param.description, &mut vocab);
            }
            negatives.push(
                analyzer
                    .terms(&doc.when_not_to_use)
                    .into_iter()
                    .map(|t| intern(t, &mut vocab))
                    .collect(),
            );

            for phrase in doc.triggers.iter().chain(&doc.aliases) {
                let stems: Vec<String> =
                    analyzer.words(phrase).into_iter().map(|w| w.stem).collect();
                if let Some(first) = stems.first() {
                    phrases
                        .entry(first.clone())
                        .or_default()
                        .push((doc_id as u32, stems));
                }
            }
            let mut name_terms = fields[Field::Name as usize].clone();
            name_terms.sort_unstable();
            name_terms.dedup();
            entries.push(Entry {
                name: doc.name,
                owner_only: doc.owner_only,
                chat_types: doc.chat_types,
                plan_threshold: doc.plan_threshold,
                name_mass: 0.0,
                name_terms,
            });
            fields_of.push(fields);
        }

        let n_docs = entries.len();
        let n_terms = vocab.len();
        let mut avg_len = [0f32; FIELDS];
        for fields in &fields_of {
            for (f, terms) in fields.iter().enumerate() {
                avg_len[f] += terms.len() as f32;
            }
        }
        for len in &mut avg_len {
            *len = (*len / n_docs.max(1) as f32).max(1.0);
        }

        // Prefix of every term (terms no longer than the prefix have none).
        let mut by_id: Vec<&str> = vec![""; n_terms];
        for (stem, &id) in &vocab {
            by_id[id as usize] = stem;
        }
        let mut prefixes: HashMap<String, u32> = HashMap::new();
        let prefix_of: Vec<Option<u32>> = by_id
            .iter()
            .map(|stem| {
                let key = prefix(stem, settings.prefix_len)?;
                let next = prefixes.len() as u32;
                Some(*prefixes.entry(key.to_owned()).or_insert(next))
            })
            .collect();

        let mut postings: Vec<Vec<(u32, f32)>> = vec![Vec::new(); n_terms];
        let mut prefix_postings: Vec<Vec<(u32, f32)>> = vec![Vec::new(); prefixes.len()];
        let mut tf: HashMap<u32, f32> = HashMap::new();
        let mut ptf: HashMap<u32, f32> = HashMap::new();
        for (doc_id, fields) in fields_of.iter().enumerate() {
            tf.clear();
            ptf.clear();
            for (f, terms) in fields.iter().enumerate() {
                let norm = 1.0 - settings.b + settings.b * terms.len() as f32 / avg_len[f];
                for &t in terms {
                    *tf.entry(t).or_default() += weights[f] / norm;
                    if let Some(p) = prefix_of[t as usize] {
                        *ptf.entry(p).or_default() += weights[f] / norm;
                    }
                }
            }
            for (&t, &freq) in &tf {
                postings[t as usize].push((doc_id as u32, freq / (settings.k1 + freq)));
            }
            for (&p, &freq) in &ptf {
                prefix_postings[p as usize].push((doc_id as u32, freq / (settings.k1 + freq)));
            }
        }
        let mut negative: Vec<Vec<(u32, f32)>> = vec![Vec::new(); n_terms];
        for (doc_id, terms) in negatives.iter().enumerate() {
            tf.clear();
            for &t in terms {
                *tf.entry(t).or_default() += settings.weights.when_not_to_use;
            }
            for (&t, &freq) in &tf {
                negative[t as usize].push((doc_id as u32, freq / (settings.k1 + freq)));
            }
        }
        for list in postings
            .iter_mut()
            .chain(negative.iter_mut())
            .chain(prefix_postings.iter_mut())
        {
            list.sort_unstable_by_key(|&(d, _)| d);
        }

        // A small catalog is scored as if among `idf_min_docs` unrelated tools, so that a word
        // only one of three tools has weighs about what it would in a large catalog.
        let n_idf = n_docs.max(settings.idf_min_docs) as f32;
        let idf_of = |df: usize| ((n_idf - df as f32 + 0.5) / (df as f32 + 0.5)).ln_1p();
        let idf: Vec<f32> = postings.iter().map(|p| idf_of(p.len())).collect();
        let max_idf = idf_of(0);
        let prefix_idf: Vec<f32> = prefix_postings.iter().map(|p| idf_of(p.len())).collect();
        for entry in &mut entries {
            entry.name_mass = entry.name_terms.iter().map(|&t| idf[t as usize]).sum();
        }

        Self {
            entries,
            vocab,
            idf,
            postings,
            negative,
            prefixes,
            prefix_idf,
            prefix_postings,
            bigrams,
            phrases,
            max_idf,
        }
    }
}
