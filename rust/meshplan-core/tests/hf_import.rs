//! Imports every verbatim Hugging Face `config.json` under the repository's `tests/fixtures/hf/`
//! (provenance in tests/fixtures/hf/SOURCES.md; the one copy, shared with the
//! Python suite) and checks the key dimensions and the parameter counts against the published
//! model sizes.

use std::path::PathBuf;

use meshplan_core::hf::model_from_hf_config;
use meshplan_core::{presets, Error, Model};

/// The repository's `tests/fixtures/hf`, the one copy of the configs (the Python suite reads it too).
fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/hf")
}

fn fixture(file: &str) -> String {
    let path = fixture_dir().join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn import(file: &str) -> Model {
    let m = model_from_hf_config(&fixture(file), None).unwrap_or_else(|e| panic!("{file}: {e}"));
    m.validate().unwrap();
    m
}

fn billions(n: u64) -> f64 {
    n as f64 / 1e9
}

/// Asserts `got` (billions) is within `rel` of the published `want`.
fn assert_size(what: &str, got: f64, want: f64, rel: f64) {
    assert!(
        ((got - want) / want).abs() <= rel,
        "{what}: {got:.3} B, published {want} B (tolerance {:.1} %)",
        rel * 100.0
    );
}

/// Published "active parameters" include the input embedding; `active_matmul_params` does not.
fn active_with_embedding(m: &Model) -> f64 {
    billions(m.active_matmul_params() + m.embedding_params())
}

fn dims(m: &Model) -> (u32, u32, u32, u32, u32, u32) {
    (
        m.layers,
        m.hidden,
        m.heads,
        m.kv_heads,
        m.ffn_hidden,
        m.vocab,
    )
}

#[test]
fn every_fixture_imports_and_validates() {
    let dir = fixture_dir();
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let file = path.file_name().unwrap().to_str().unwrap().to_string();
            let text = std::fs::read_to_string(&path).unwrap();
            let result = model_from_hf_config(&text, None);
            if let Some((_, field)) = UNSUPPORTED.iter().find(|(f, _)| *f == file) {
                let e = result.expect_err(&file);
                assert!(e.to_string().contains(field), "{file}: {e}");
                continue;
            }
            let m = result.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            // Nemotron-H's MLPs and experts are plain squared-ReLU; every other family gated.
            let plain = text.contains("\"nemotron_h\"");
            assert_eq!(m.activation.gated(), !plain, "{}", path.display());
            n += 1;
        }
    }
    assert!(
        n >= 11,
        "expected the configs of tests/fixtures/hf, got {n}"
    );
}

/// Fixtures the importer rejects, with the key its error names: what they need is not
/// modelled.
const UNSUPPORTED: [(&str, &str); 1] = [("DeepSeek-V4-Flash.json", "model_type")];

#[test]
fn nemotron_3_super_and_ultra_are_latent_moe_hybrids() {
    // Nemotron 3 Super 120B-A12B and Ultra 550B-A55B (their names' totals and active counts):
    // experts at the latent width, two h↔ℓ projections per MoE layer.
    for (file, latent, total, active) in [
        (
            "NVIDIA-Nemotron-3-Super-120B-A12B-FP8.json",
            1024,
            120.0,
            12.0,
        ),
        (
            "NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16.json",
            2048,
            550.0,
            55.0,
        ),
    ] {
        let m = import(file);
        let moe = m.moe.unwrap();
        assert_eq!(moe.latent_size, Some(latent), "{file}");
        assert_eq!(moe.expert_width(m.hidden), latent);
        assert_size(file, billions(m.total_params()), total, 0.08);
        assert_size(file, active_with_embedding(&m), active, 0.12);
        // One MTP depth of an attention layer and an MoE layer: Super spells it
        // `mtp_hybrid_override_pattern` "*E", Ultra `mtp_layers_block_type`
        // ["attention", "moe"]; `num_nextn_predict_layers` 1 in both.
        assert_eq!(m.mtp_layers, Some(1), "{file}");
        assert_eq!(m.mtp_pattern.as_deref(), Some("*E"), "{file}");
    }
}

#[test]
fn llama_3_1_405b() {
    let m = import("Llama-3.1-405B.json");
    assert_eq!(dims(&m), (126, 16384, 128, 8, 53248, 128256));
    assert!(!m.tied_embeddings && m.moe.is_none() && m.head_dim.is_none());
    assert_eq!(m.name, "llama");
    assert_size("Llama-3.1-405B", billions(m.total_params()), 405.8, 0.005);
    // Same shape as the built-in preset.
    let preset = presets::model("llama3.1-405b").unwrap();
    assert_eq!(
        Model {
            name: preset.name.clone(),
            ..m
        },
        preset
    );
}

#[test]
fn mixtral_8x7b_and_8x22b() {
    let m = import("Mixtral-8x7B-v0.1.json");
    assert_eq!(dims(&m), (32, 4096, 32, 8, 14336, 32000));
    let moe = m.moe.as_ref().unwrap();
    assert_eq!(
        (
            moe.num_experts,
            moe.top_k,
            moe.expert_ffn_hidden,
            moe.first_dense_layers
        ),
        (8, 2, 14336, 0)
    );
    assert_size("Mixtral-8x7B", billions(m.total_params()), 46.7, 0.01);
    assert_size("Mixtral-8x7B active", active_with_embedding(&m), 12.9, 0.02);
    assert_eq!(
        Model {
            name: "mixtral-8x7b".into(),
            ..m
        },
        presets::model("mixtral-8x7b").unwrap()
    );

    let m = import("Mixtral-8x22B-v0.1.json");
    assert_eq!(dims(&m), (56, 6144, 48, 8, 16384, 32000));
    assert_size("Mixtral-8x22B", billions(m.total_params()), 141.0, 0.01);
    assert_size(
        "Mixtral-8x22B active",
        active_with_embedding(&m),
        39.0,
        0.02,
    );
}

#[test]
fn qwen2_5_72b() {
    let m = import("Qwen2.5-72B.json");
    assert_eq!(dims(&m), (80, 8192, 64, 8, 29568, 152064));
    assert!(!m.tied_embeddings && m.moe.is_none());
    // 72.7 B published; the QKV biases (≈10 M) are not modelled.
    assert_size("Qwen2.5-72B", billions(m.total_params()), 72.7, 0.01);
}

#[test]
fn qwen3_30b_a3b() {
    let m = import("Qwen3-30B-A3B.json");
    assert_eq!(dims(&m), (48, 2048, 32, 4, 6144, 151936));
    assert_eq!(m.head_dim, Some(128), "head_dim 128 ≠ 2048/32");
    assert_eq!(m.qk_head_dim(), 128);
    let moe = m.moe.as_ref().unwrap();
    assert_eq!(
        (
            moe.num_experts,
            moe.top_k,
            moe.expert_ffn_hidden,
            moe.first_dense_layers,
            moe.shared_experts
        ),
        (128, 8, 768, 0, 0)
    );
    assert_size("Qwen3-30B-A3B", billions(m.total_params()), 30.5, 0.01);
    assert_size("Qwen3-30B-A3B active", active_with_embedding(&m), 3.3, 0.02);
    assert_eq!(
        Model {
            name: "qwen3-30b-a3b".into(),
            ..m
        },
        presets::model("qwen3-30b-a3b").unwrap()
    );
}

#[test]
fn qwen3_235b_a22b() {
    let m = import("Qwen3-235B-A22B.json");
    assert_eq!(dims(&m), (94, 4096, 64, 4, 12288, 151936));
    assert_eq!(m.head_dim, Some(128));
    let moe = m.moe.as_ref().unwrap();
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.expert_ffn_hidden),
        (128, 8, 1536)
    );
    assert_size("Qwen3-235B-A22B", billions(m.total_params()), 235.0, 0.01);
    assert_size(
        "Qwen3-235B-A22B active",
        active_with_embedding(&m),
        22.0,
        0.02,
    );
    assert_eq!(
        Model {
            name: "qwen3-235b-a22b".into(),
            ..m
        },
        presets::model("qwen3-235b-a22b").unwrap()
    );
}

#[test]
fn deepseek_v3() {
    let m = import("DeepSeek-V3.json");
    assert_eq!(dims(&m), (61, 7168, 128, 128, 18432, 129280));
    let moe = m.moe.as_ref().unwrap();
    assert_eq!(
        (
            moe.num_experts,
            moe.top_k,
            moe.expert_ffn_hidden,
            moe.shared_experts,
            moe.first_dense_layers
        ),
        (256, 8, 2048, 1, 3)
    );
    let mla = m.mla.as_ref().unwrap();
    assert_eq!(
        (
            mla.q_lora_rank,
            mla.kv_lora_rank,
            mla.qk_rope_head_dim,
            mla.qk_nope_head_dim,
            mla.v_head_dim
        ),
        (Some(1536), 512, 64, 128, 128)
    );
    assert_eq!((m.qk_head_dim(), m.v_head_dim()), (192, 128));
    // 671 B without the multi-token-prediction layer (the checkpoint's 685 B includes it).
    assert_size("DeepSeek-V3", billions(m.total_params()), 671.0, 0.01);
    assert_size("DeepSeek-V3 active", active_with_embedding(&m), 37.0, 0.02);
    assert_eq!(
        Model {
            name: "deepseek-v3".into(),
            ..m
        },
        presets::model("deepseek-v3").unwrap()
    );
}

#[test]
fn kimi_k2() {
    let m = import("Kimi-K2-Instruct.json");
    assert_eq!(dims(&m), (61, 7168, 64, 64, 18432, 163840));
    let moe = m.moe.as_ref().unwrap();
    assert_eq!(
        (
            moe.num_experts,
            moe.top_k,
            moe.expert_ffn_hidden,
            moe.shared_experts,
            moe.first_dense_layers
        ),
        (384, 8, 2048, 1, 1)
    );
    assert!(m.mla.is_some());
    // "1T total, 32B activated" (Moonshot); 1.03 T on the model card's own count.
    assert_size("Kimi-K2", billions(m.total_params()), 1030.0, 0.01);
    assert_size("Kimi-K2 active", active_with_embedding(&m), 32.0, 0.03);
}

#[test]
fn glm_4_5() {
    let m = import("GLM-4.5.json");
    assert_eq!(dims(&m), (92, 5120, 96, 8, 12288, 151552));
    assert_eq!(m.head_dim, Some(128), "head_dim 128 ≠ 5120/96");
    let moe = m.moe.as_ref().unwrap();
    assert_eq!(
        (
            moe.num_experts,
            moe.top_k,
            moe.expert_ffn_hidden,
            moe.shared_experts,
            moe.first_dense_layers
        ),
        (160, 8, 1536, 1, 3)
    );
    // 355 B total / 32 B active published; the MTP layer and biases are not modelled. The
    // active figure matches the matmul count (33.6 B with the input embedding).
    assert_size("GLM-4.5", billions(m.total_params()), 355.0, 0.015);
    assert_size(
        "GLM-4.5 active",
        billions(m.active_matmul_params()),
        32.0,
        0.03,
    );
}

#[test]
fn gpt_oss_120b() {
    let m = import("gpt-oss-120b.json");
    assert_eq!(dims(&m), (36, 2880, 64, 8, 2880, 201088));
    assert_eq!(m.head_dim, Some(64), "head_dim 64 ≠ 2880/64");
    let moe = m.moe.as_ref().unwrap();
    assert_eq!(
        (
            moe.num_experts,
            moe.top_k,
            moe.expert_ffn_hidden,
            moe.first_dense_layers
        ),
        (128, 4, 2880, 0)
    );
    // OpenAI: 116.8 B total, 5.1 B active per token.
    assert_size("gpt-oss-120b", billions(m.total_params()), 117.0, 0.01);
    assert_size(
        "gpt-oss-120b active",
        billions(m.active_matmul_params()),
        5.1,
        0.02,
    );
}

#[test]
fn phi_3_medium() {
    let m = import("Phi-3-medium-4k-instruct.json");
    assert_eq!(dims(&m), (40, 5120, 40, 10, 17920, 32064));
    assert_eq!(
        m.name, "Phi-3-medium-4k-instruct",
        "taken from _name_or_path"
    );
    assert_size("Phi-3-medium", billions(m.total_params()), 14.0, 0.01);
}

#[test]
fn the_name_argument_wins() {
    let m =
        model_from_hf_config(&fixture("Phi-3-medium-4k-instruct.json"), Some("phi3-14b")).unwrap();
    assert_eq!(m.name, "phi3-14b");
}

fn hf_field(e: &Error) -> &str {
    match e {
        Error::HfConfig { field, .. } => field,
        other => panic!("expected an HfConfig error, got {other:?}"),
    }
}

/// The fixture as a JSON object, to edit one field.
fn edited(
    file: &str,
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> String {
    let mut v: serde_json::Value = serde_json::from_str(&fixture(file)).unwrap();
    edit(v.as_object_mut().unwrap());
    v.to_string()
}

#[test]
fn a_missing_required_field_is_named() {
    for (file, key) in [
        ("Llama-3.1-405B.json", "num_hidden_layers"),
        ("Llama-3.1-405B.json", "vocab_size"),
        ("Mixtral-8x7B-v0.1.json", "num_local_experts"),
        ("Qwen3-30B-A3B.json", "moe_intermediate_size"),
        ("DeepSeek-V3.json", "kv_lora_rank"),
        ("DeepSeek-V3.json", "first_k_dense_replace"),
        ("GLM-4.5.json", "n_shared_experts"),
    ] {
        let text = edited(file, |o| {
            o.remove(key).unwrap();
        });
        let e = model_from_hf_config(&text, None).unwrap_err();
        assert_eq!(hf_field(&e), key, "{file}: {e}");
        assert!(e.to_string().contains("missing"), "{e}");
    }
}

#[test]
fn a_wrongly_typed_field_is_named() {
    let text = edited("Qwen3-235B-A22B.json", |o| {
        o.insert("num_experts".into(), "128".into());
    });
    let e = model_from_hf_config(&text, None).unwrap_err();
    assert_eq!(hf_field(&e), "num_experts");
    assert!(
        e.to_string()
            .contains("expected a non-negative integer, got \"128\""),
        "{e}"
    );

    let text = edited("Llama-3.1-405B.json", |o| {
        o.insert("hidden_act".into(), 1.into());
    });
    assert_eq!(
        hf_field(&model_from_hf_config(&text, None).unwrap_err()),
        "hidden_act"
    );
}

#[test]
fn an_unknown_model_type_lists_the_supported_ones() {
    let text = edited("Llama-3.1-405B.json", |o| {
        o.insert("model_type".into(), "gemma2".into());
    });
    let e = model_from_hf_config(&text, None).unwrap_err();
    assert_eq!(hf_field(&e), "model_type");
    let msg = e.to_string();
    assert!(msg.contains("unsupported 'gemma2'"), "{msg}");
    for t in [
        "llama",
        "mixtral",
        "qwen3_moe",
        "deepseek_v3",
        "kimi_k2",
        "glm4_moe",
        "gpt_oss",
        "phi3",
    ] {
        assert!(msg.contains(t), "{t} missing from: {msg}");
    }
    assert_eq!(e.kind(), "hf_config");
}

#[test]
fn text_that_is_not_json_is_rejected() {
    for text in [
        "",
        "model_type: llama",
        "{\"model_type\": \"llama\",",
        "null",
        "[]",
    ] {
        let e = model_from_hf_config(text, None).unwrap_err();
        assert_eq!(hf_field(&e), "config.json", "{text:?}: {e}");
    }
}

#[test]
fn nemotron_h_56b_reads_the_hybrid_override_pattern() {
    let m = import("Nemotron-H-56B-Base-8K.json");
    assert_eq!(dims(&m), (118, 8192, 64, 8, 32768, 131072));
    // `attention_head_dim`, the older key, is the head dimension.
    assert_eq!(m.head_dim, Some(128));
    let p = m.layer_pattern.as_deref().unwrap();
    assert!(p.starts_with("M-M-M-M*-") && p.len() == 118);
    // SOURCES.md: 54 Mamba, 54 MLP and 10 attention layers.
    let count = |c| p.chars().filter(|&x| x == c).count();
    assert_eq!((count('M'), count('-'), count('*')), (54, 54, 10));
    let mamba = m.mamba.unwrap();
    assert_eq!(
        (mamba.heads, mamba.head_dim, mamba.state, mamba.groups),
        (256, 64, 256, 8)
    );
    assert_eq!((mamba.conv_kernel, mamba.chunk), (4, 128));
    assert_eq!(m.activation.name(), "relu2");
    assert!(m.moe.is_none());
    // Three kinds (Mamba, MLP, attention), one run per character change.
    assert_eq!(m.layer_kinds().len(), 3);
    assert_eq!(m.dense_layers(), 54);
    assert_eq!(m.attention_layers(), 10);
    // Nemotron-H paper (arXiv 2504.03624): 56 B parameters.
    assert_size("Nemotron-H-56B", billions(m.total_params()), 56.3, 0.01);
}

#[test]
fn nemotron_3_nano_is_mamba_attention_and_moe() {
    let m = import("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json");
    let p = m.layer_pattern.as_deref().unwrap();
    assert_eq!(p, "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME");
    let moe = m.moe.unwrap();
    assert_eq!(
        (
            moe.num_experts,
            moe.top_k,
            moe.expert_ffn_hidden,
            moe.shared_experts,
            moe.shared_expert_ffn_hidden
        ),
        (128, 6, 1856, 1, Some(3712))
    );
    assert_eq!((m.moe_layers(), m.dense_layers()), (23, 0));
    // NVIDIA: 31.6 B total, 3.2 B active (3.6 B with the embeddings).
    assert_size("Nemotron-3-Nano", billions(m.total_params()), 31.6, 0.005);
    assert_size(
        "Nemotron-3-Nano active",
        active_with_embedding(&m),
        3.6,
        0.01,
    );
    // The NVFP4 3.5-Lightning file spells the same stack as a `layers_block_type` list.
    let l = import("NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4.json");
    assert_eq!(l.layer_pattern, m.layer_pattern);
    // Lightning adds an MTP block (attention + MoE), Nano has none.
    assert_eq!(
        (l.mtp_layers, l.mtp_pattern.as_deref()),
        (Some(1), Some("*E"))
    );
    assert_eq!((m.mtp_layers, m.mtp_pattern), (None, None));
}

#[test]
fn qwen3_next_interleaves_gated_deltanet_and_full_attention() {
    let m = import("Qwen3-Next-80B-A3B-Instruct.json");
    // full_attention_interval 4: layers 3, 7, ... are full attention; every layer MoE.
    assert_eq!(m.layer_pattern.as_deref().unwrap(), "GGGA".repeat(12));
    let la = m.linear_attention.unwrap();
    assert_eq!(
        (
            la.key_heads,
            la.key_head_dim,
            la.value_heads,
            la.value_head_dim
        ),
        (16, 128, 32, 128)
    );
    assert_eq!(la.conv_kernel, 4);
    let moe = m.moe.unwrap();
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.shared_experts),
        (512, 10, 1)
    );
    // Qwen: 80 B total, the 12 attention layers' output gates (2048 × 16·256 each) included.
    assert!(m.attention_output_gate);
    assert_size("Qwen3-Next-80B", billions(m.total_params()), 80.0, 0.01);
    let mut ungated = m.clone();
    ungated.attention_output_gate = false;
    assert_eq!(
        m.total_params() - ungated.total_params(),
        12 * 2048 * 16 * 256
    );
}

#[test]
fn gpt_oss_layer_types_become_sliding_window_layers() {
    let m = import("gpt-oss-20b.json");
    assert_eq!(m.layer_pattern.as_deref().unwrap(), "SA".repeat(12));
    assert_eq!(m.sliding_window, Some(128));
    // OpenAI: 20.9 B total.
    assert_size("gpt-oss-20b", billions(m.total_params()), 20.9, 0.01);
}

#[test]
fn bad_patterns_name_the_key() {
    let base = fixture("Nemotron-H-56B-Base-8K.json");
    let bad = base.replace("M-M-M-M*-M", "M-M-X-M*-M");
    let e = model_from_hf_config(&bad, None).unwrap_err().to_string();
    assert!(
        e.contains("hybrid_override_pattern") && e.contains("'X'"),
        "{e}"
    );
    let short = base.replace("\"num_hidden_layers\": 118", "\"num_hidden_layers\": 117");
    let e = model_from_hf_config(&short, None).unwrap_err().to_string();
    assert!(
        e.contains("hybrid_override_pattern") && e.contains("117"),
        "{e}"
    );
    let no_heads = base.replace("\"mamba_num_heads\": 256,", "");
    let e = model_from_hf_config(&no_heads, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("mamba_num_heads") && e.contains("missing"),
        "{e}"
    );
}
