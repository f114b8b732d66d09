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
            let text = std::fs::read_to_string(&path).unwrap();
            let m = model_from_hf_config(&text, None)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(m.activation.gated(), "{}", path.display());
            n += 1;
        }
    }
    assert_eq!(n, 11, "expected the 11 configs of shared/hf-configs");
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
