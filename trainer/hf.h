/* trainer/hf.h — Hugging Face Transformers interop: `ctrain import-hf` and `ctrain export-hf`.
 *
 * Supported architectures (config.json "architectures"[0], else "model_type"):
 *   GPT2LMHeadModel   -> arch gpt2  (Conv1D weights are stored (in, out): transposed)
 *   LlamaForCausalLM  -> arch llama
 *   Qwen2ForCausalLM  -> arch llama, attn_bias (bias on q/k/v)
 *   Qwen3ForCausalLM  -> arch llama, qk_norm (per-head q/k RMSNorm), explicit head_dim
 * Anything the ctrain model cannot reproduce exactly is refused with a message naming the
 * config.json key: rope scaling, sliding-window attention, other activations, biases on
 * o_proj or the MLP, partial rotary embeddings, cross-attention.
 *
 * Tensors map through the model's parameter table (every ctrain parameter is filled exactly
 * once; fused tensors are row concatenations: qkv_proj = [q; k; v], gate_up_proj = [gate; up]).
 * Every HF tensor must be used, except known redundant ones: lm_head.weight of a tied model
 * (checked equal to the embedding), GPT-2's attn.bias / attn.masked_bias buffers and rotary
 * inv_freq buffers. Embedding rows past vocab_size (ctrain's padding to vocab_pad) are zero on
 * import and dropped on export. F32 export followed by import is bit-exact.
 */
#ifndef CT_HF_H
#define CT_HF_H

#include "common/status.h"
#include "kernels/ops.h"
#include "trainer/config.h"
#include "trainer/model.h"
#include "trainer/safetensors.h"

/* Reads DIR/config.json into a validated ct_config (defaults for everything else;
 * data.tokenizer = DIR/tokenizer.json as an absolute path when it exists, else "byte"). */
ct_status ct_hf_read_config(const char *dir, ct_config *cfg);

/* Builds a model (on `ops`, activations for max_B x max_T) from DIR's config.json and
 * safetensors weights (model.safetensors or a sharded index). *cfg receives the config. */
ct_status ct_hf_load(const char *dir, const ct_ops *ops, int max_B, int max_T, ct_config *cfg,
                     ct_model **out);

/* import-hf: DIR -> a weights-only ctrain checkpoint directory (ct_checkpoint_write_dir). */
ct_status ct_hf_import(const char *dir, const char *out_ckpt);

/* Writes DIR/config.json and DIR/model.safetensors (dtype F32, BF16 or F16; rounding to
 * nearest even) for model m with config cfg, and copies the tokenizer.json that
 * cfg->data.tokenizer names, if any. DIR is created if needed. */
ct_status ct_hf_save(const ct_config *cfg, ct_model *m, const char *dir, ct_st_dtype dtype);

/* export-hf: a ctrain checkpoint (any path ct_checkpoint_read_config accepts) -> DIR. */
ct_status ct_hf_export(const char *ckpt, const char *dir, ct_st_dtype dtype);

/* `ctrain import-hf DIR OUT_CKPT` and `ctrain export-hf CKPT DIR [--dtype f32|bf16|f16]`
 * (argv[0] is the first argument after the command name). Bad usage is CT_ERR_USAGE. */
ct_status ct_cmd_import_hf(int argc, char **argv);
ct_status ct_cmd_export_hf(int argc, char **argv);

#endif
