use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use bulkhead_gpu_host::Tokenizer;
use bulkhead_gpu_host::engine::{Model, ModelConfig};
use bulkhead_gpu_host::gguf::{Array, Gguf, GgufError, Limits, TensorTypes, Value, type_name};
use bulkhead_kernels::GgmlType;
use clap::Args;

/// Array elements shown per metadata entry; vocabularies have 100k+.
const SHOWN_ELEMENTS: usize = 8;
/// Characters shown of a long string value (chat templates).
const SHOWN_CHARS: usize = 120;

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// GGUF file.
    #[arg(long)]
    model: PathBuf,
}

#[derive(Debug, Args)]
pub struct TokenizeArgs {
    /// GGUF file with a tokenizer.
    #[arg(long)]
    model: PathBuf,
    /// Text to tokenize (special tokens such as BOS are added as the model asks).
    #[arg(long)]
    text: String,
}

pub fn run(a: InspectArgs) -> anyhow::Result<()> {
    let gguf = match Gguf::open(&a.model) {
        Ok(gguf) => gguf,
        // A GGUF whose tensors the engine cannot read: still say which.
        Err(GgufError::UnknownTensorType { .. }) => return unreadable_tensors(&a),
        Err(e) => return Err(e).with_context(|| format!("reading {}", a.model.display())),
    };
    let mut s = String::new();
    writeln!(
        s,
        "file: {} ({} bytes, GGUF v{})",
        a.model.display(),
        gguf.file_len(),
        gguf.version()
    )?;
    writeln!(s, "runnable: {}", runnable(&gguf))?;
    if let Ok(c) = ModelConfig::from_gguf(&gguf) {
        writeln!(
            s,
            "architecture: {} — {} layers, width {}, {} heads ({} kv), head {}, ffn {}, vocab {}, context {}, rope base {} scale {}",
            c.arch.name(),
            c.layers,
            c.embedding_dim,
            c.heads,
            c.kv_heads,
            c.head_dim,
            c.ffn_dim,
            c.vocab_size,
            c.context_length,
            c.rope.base,
            c.rope.scale
        )?;
    }
    writeln!(s, "\nmetadata ({} entries):", gguf.metadata().len())?;
    for (key, value) in gguf.metadata().iter() {
        writeln!(s, "  {key} = {}", show_value(value))?;
    }
    writeln!(s, "\ntensors ({}):", gguf.tensors().len())?;
    let mut histogram = std::collections::BTreeMap::<&str, usize>::new();
    for t in gguf.tensors() {
        *histogram.entry(t.ty.name()).or_default() += 1;
        writeln!(
            s,
            "  {:<32} {:<6} {:?} {} bytes @ {}",
            t.name,
            t.ty.name(),
            t.dims,
            t.size_bytes,
            t.file_offset
        )?;
    }
    writeln!(s, "\ntensor types: {histogram:?}")?;
    std::io::stdout().lock().write_all(s.as_bytes())?;
    Ok(())
}

/// `yes`, with where it runs, or `no` and the first reason: the
/// architecture, the metadata key or the tensor, named as the engine's
/// loader names them.
fn runnable(gguf: &Gguf) -> String {
    let (config, missing) = match Model::check(gguf) {
        Ok(checked) => checked,
        Err(e) => return format!("no: {e}"),
    };
    if let Err(e) = Tokenizer::from_metadata(gguf.metadata()) {
        return format!("no: tokenizer: {e}");
    }
    let device = if missing.is_empty() {
        "and on GPU backends".to_string()
    } else {
        format!("only (a GPU backend lacks {})", missing.join(", "))
    };
    format!("yes ({} on the CPU backend {device})", config.arch.name())
}

/// What `inspect` says of a GGUF with tensors of types the engine cannot
/// read: each such tensor by name and type, and the metadata.
fn unreadable_tensors(a: &InspectArgs) -> anyhow::Result<()> {
    let bytes =
        std::fs::read(&a.model).with_context(|| format!("reading {}", a.model.display()))?;
    let scan = TensorTypes::scan(&bytes, &Limits::default())
        .with_context(|| format!("reading {}", a.model.display()))?;
    let unsupported: Vec<(&str, String)> = scan
        .tensors
        .iter()
        .filter(|(_, id)| GgmlType::from_id(*id).is_none())
        .map(|(name, id)| (name.as_str(), type_name(*id)))
        .collect();
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for (_, ty) in &unsupported {
        *counts.entry(ty.as_str()).or_default() += 1;
    }
    let mut s = String::new();
    writeln!(s, "file: {} ({} bytes)", a.model.display(), bytes.len())?;
    writeln!(
        s,
        "runnable: no: {} of {} tensors have types the engine cannot compute with ({})",
        unsupported.len(),
        scan.tensors.len(),
        counts
            .iter()
            .map(|(ty, n)| format!("{ty}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    writeln!(s, "\nunsupported tensors:")?;
    for (name, ty) in &unsupported {
        writeln!(s, "  {name:<32} {ty}")?;
    }
    writeln!(s, "\nmetadata ({} entries):", scan.metadata.len())?;
    for (key, value) in scan.metadata.iter() {
        writeln!(s, "  {key} = {}", show_value(value))?;
    }
    std::io::stdout().lock().write_all(s.as_bytes())?;
    Ok(())
}

pub fn tokenize(a: TokenizeArgs) -> anyhow::Result<()> {
    let gguf = Gguf::open(&a.model).with_context(|| format!("reading {}", a.model.display()))?;
    let tokenizer = Tokenizer::from_metadata(gguf.metadata()).context("reading the tokenizer")?;
    let ids = tokenizer.encode(&a.text, true);
    writeln!(std::io::stdout().lock(), "{}", serde_json::to_string(&ids)?)?;
    Ok(())
}

fn show_value(v: &Value) -> String {
    match v {
        Value::String(s) if s.chars().count() > SHOWN_CHARS => {
            let head: String = s.chars().take(SHOWN_CHARS).collect();
            format!("{head:?}… ({} bytes)", s.len())
        }
        Value::String(s) => format!("{s:?}"),
        Value::Array(a) => show_array(a),
        other => format!("{other:?}"),
    }
}

fn show_array(a: &Array) -> String {
    fn head<T: std::fmt::Debug>(v: &[T]) -> String {
        let shown: Vec<String> = v
            .iter()
            .take(SHOWN_ELEMENTS)
            .map(|x| format!("{x:?}"))
            .collect();
        let more = if v.len() > SHOWN_ELEMENTS {
            ", …"
        } else {
            ""
        };
        format!(
            "[{}{more}] ({} × {})",
            shown.join(", "),
            v.len(),
            std::any::type_name::<T>()
        )
    }
    match a {
        Array::U8(v) => head(v),
        Array::I8(v) => head(v),
        Array::U16(v) => head(v),
        Array::I16(v) => head(v),
        Array::U32(v) => head(v),
        Array::I32(v) => head(v),
        Array::F32(v) => head(v),
        Array::Bool(v) => head(v),
        Array::String(v) => head(v),
        Array::Array(v) => format!("[{} nested arrays]", v.len()),
        Array::U64(v) => head(v),
        Array::I64(v) => head(v),
        Array::F64(v) => head(v),
    }
}
