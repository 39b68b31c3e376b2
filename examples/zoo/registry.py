"""The model zoo: `transformers` architectures from small configs with random weights.

Every entry builds a tiny model (2 layers, width 32-64, short sequences, small images) from a
config written here in code: nothing is downloaded (`gpt2_124m`, the real GPT-2 small config,
is the one real-size entry). `ZOO[name].build()` returns
`(module, tuple_of_tensor_inputs)` as the CLI contract asks; `examples/zoo/<name>.py` is a thin
file around it so that `tapml-dbg record examples/zoo/<name>.py -o t.h5` works.

Conventions, each one there for a reason:
- `attn_implementation="eager"`: the exported graph then computes exactly what the model's
  forward does (torch's fused sdpa kernel and its decomposition differ in the last bits).
- an explicit attention mask for text models: without one, HF builds it with a `cumsum` over
  a bool tensor, which TVM 0.27 imports keeping dtype bool (see docs/coverage.md).
- `Positional` turns an HF model's keyword forward into a positional one returning one tensor.
- batch-norm running statistics are randomized, as in a trained model (otherwise the
  normalization is an identity and a wrong kernel could hide behind it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

SEQ = 16  # tokens per text input
VOCAB = 1000
IMAGE = 32  # pixels per side of an image input
AUDIO_SAMPLES = 1600  # 0.1 s at 16 kHz


@dataclass(frozen=True)
class Entry:
    name: str
    family: str  # decoder | encoder | encoder-decoder | vision | cnn | audio
    build: Callable[[], tuple]
    slow: bool = False  # too large for the fast CI subset
    note: str = ""


ZOO: dict[str, Entry] = {}


def register(name: str, family: str, slow: bool = False, note: str = ""):
    def wrap(func):
        ZOO[name] = Entry(name, family, func, slow, note)
        return func
    return wrap


def builder(name: str) -> Callable[[], tuple]:
    """The `build()` of one zoo entry (what a thin `examples/zoo/<name>.py` exposes)."""
    return ZOO[name].build


class Positional(torch.nn.Module):
    """A positional forward over an HF model's keyword forward, returning one tensor.

    `names` are the keyword arguments the positional inputs bind to; `output` is the field of
    the model's output to return; `fixed` are constant keyword arguments (use_cache=False...).
    """

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...], output: str, **fixed):
        super().__init__()
        self.model = model
        self.names = tuple(names)
        self.output = output
        self.fixed = fixed

    def forward(self, *inputs):
        result = self.model(**dict(zip(self.names, inputs)), **self.fixed)
        return getattr(result, self.output)


def _text_inputs(vocab: int = VOCAB, seq: int = SEQ, batch: int = 1):
    ids = torch.randint(3, vocab, (batch, seq))  # ids 0..2 are the special tokens of most configs
    return ids, torch.ones(batch, seq, dtype=torch.long)


def _image(channels: int = 3, size: int = IMAGE):
    return torch.randn(1, channels, size, size)


def _randomize_batch_norm(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 1.5)
    return model


TOKENS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
EAGER = dict(attn_implementation="eager")


def _causal_lm(model_class, config_class, **settings):
    """A decoder LLM: (input_ids, attention_mask) -> logits."""
    config = config_class(**{**TOKENS, **EAGER, "vocab_size": VOCAB, **settings})
    model = model_class(config).eval()
    return Positional(model, ("input_ids", "attention_mask"), "logits", use_cache=False), _text_inputs()


def _encoder(model_class, config_class, output="last_hidden_state", **settings):
    """A text encoder: (input_ids, attention_mask) -> hidden states."""
    config = config_class(**{**TOKENS, **EAGER, "vocab_size": VOCAB, **settings})
    model = model_class(config).eval()
    return Positional(model, ("input_ids", "attention_mask"), output), _text_inputs()


def _seq2seq(model_class, config_class, **settings):
    """An encoder-decoder, one forward: (input_ids, attention_mask, decoder_input_ids) -> logits."""
    config = config_class(**{**TOKENS, **EAGER, "vocab_size": VOCAB, **settings})
    model = model_class(config).eval()
    ids, mask = _text_inputs()
    decoder_ids = torch.randint(3, VOCAB, (1, SEQ // 2))
    return (Positional(model, ("input_ids", "attention_mask", "decoder_input_ids"), "logits", use_cache=False),
            (ids, mask, decoder_ids))


def _vision(model_class, config_class, output="last_hidden_state", size=IMAGE, **settings):
    """An image model: (pixel_values,) -> features or logits."""
    config = config_class(**settings)
    model = _randomize_batch_norm(model_class(config).eval())
    return Positional(model, ("pixel_values",), output), (_image(config.num_channels, size),)


def _audio(model_class, config_class, output="last_hidden_state", **settings):
    """A raw-waveform speech encoder: (input_values,) -> hidden states."""
    config = config_class(**{**EAGER, **settings})
    model = model_class(config).eval()
    return Positional(model, ("input_values",), output), (torch.randn(1, AUDIO_SAMPLES),)


# -------------------------------------------------------------------- decoder LLMs
LLAMA_LIKE = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)


@register("gpt2", "decoder")
def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return _causal_lm(GPT2LMHeadModel, GPT2Config, n_layer=2, n_embd=64, n_head=4, n_positions=128)


@register("gpt2_124m", "decoder", slow=True, note="the real GPT-2 small config (124M params), seq 64")
def gpt2_124m():
    from transformers import GPT2Config, GPT2LMHeadModel

    model, _ = _causal_lm(GPT2LMHeadModel, GPT2Config, n_layer=12, n_embd=768, n_head=12, n_positions=1024,
                          vocab_size=50257)
    return model, _text_inputs(vocab=50257, seq=64)


@register("llama", "decoder")
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return _causal_lm(LlamaForCausalLM, LlamaConfig, **LLAMA_LIKE)


@register("mistral", "decoder")
def mistral():
    from transformers import MistralConfig, MistralForCausalLM

    return _causal_lm(MistralForCausalLM, MistralConfig, sliding_window=8, **LLAMA_LIKE)


@register("qwen2", "decoder")
def qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return _causal_lm(Qwen2ForCausalLM, Qwen2Config, **LLAMA_LIKE)


@register("qwen3", "decoder")
def qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return _causal_lm(Qwen3ForCausalLM, Qwen3Config, head_dim=16, **LLAMA_LIKE)


@register("phi", "decoder")
def phi():
    from transformers import PhiConfig, PhiForCausalLM

    return _causal_lm(PhiForCausalLM, PhiConfig, partial_rotary_factor=0.5, **LLAMA_LIKE)


@register("phi3", "decoder")
def phi3():
    from transformers import Phi3Config, Phi3ForCausalLM

    return _causal_lm(Phi3ForCausalLM, Phi3Config, **LLAMA_LIKE)


@register("gemma", "decoder")
def gemma():
    from transformers import GemmaConfig, GemmaForCausalLM

    return _causal_lm(GemmaForCausalLM, GemmaConfig, head_dim=16, **LLAMA_LIKE)


@register("gemma2", "decoder")
def gemma2():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    return _causal_lm(Gemma2ForCausalLM, Gemma2Config, head_dim=16, sliding_window=8, **LLAMA_LIKE)


@register("opt", "decoder")
def opt():
    from transformers import OPTConfig, OPTForCausalLM

    return _causal_lm(OPTForCausalLM, OPTConfig, num_hidden_layers=2, hidden_size=64, ffn_dim=128,
                      num_attention_heads=4, word_embed_proj_dim=64, max_position_embeddings=128)


@register("gpt_neox", "decoder")
def gpt_neox():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    return _causal_lm(GPTNeoXForCausalLM, GPTNeoXConfig, num_hidden_layers=2, hidden_size=64,
                      intermediate_size=128, num_attention_heads=4, max_position_embeddings=128)


@register("bloom", "decoder")
def bloom():
    from transformers import BloomConfig, BloomForCausalLM

    return _causal_lm(BloomForCausalLM, BloomConfig, n_layer=2, hidden_size=64, n_head=4)


@register("falcon", "decoder", note="multi_query=False: see falcon_mqa")
def falcon():
    from transformers import FalconConfig, FalconForCausalLM

    # multi_query=False splits q/k/v with integer selects; the multi-query layout indexes with
    # [-2] / [-1], which TVM 0.27 imports as an unwrapped take (falcon_mqa)
    return _causal_lm(FalconForCausalLM, FalconConfig, num_hidden_layers=2, hidden_size=64,
                      num_attention_heads=4, new_decoder_architecture=False, multi_query=False, alibi=False,
                      max_position_embeddings=128)


@register("falcon_mqa", "decoder", note="the Falcon-7B multi-query layout: a documented TVM 0.27 divergence")
def falcon_mqa():
    from transformers import FalconConfig, FalconForCausalLM

    return _causal_lm(FalconForCausalLM, FalconConfig, num_hidden_layers=2, hidden_size=64,
                      num_attention_heads=4, new_decoder_architecture=False, multi_query=True, alibi=False,
                      max_position_embeddings=128)


@register("gptj", "decoder")
def gptj():
    from transformers import GPTJConfig, GPTJForCausalLM

    return _causal_lm(GPTJForCausalLM, GPTJConfig, n_layer=2, n_embd=64, n_head=4, rotary_dim=8,
                      n_positions=128)


@register("gpt_neo", "decoder")
def gpt_neo():
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    return _causal_lm(GPTNeoForCausalLM, GPTNeoConfig, num_layers=2, hidden_size=64, num_heads=4,
                      attention_types=[[["global", "local"], 1]], window_size=8, max_position_embeddings=128)


@register("codegen", "decoder")
def codegen():
    from transformers import CodeGenConfig, CodeGenForCausalLM

    return _causal_lm(CodeGenForCausalLM, CodeGenConfig, n_layer=2, n_embd=64, n_head=4, rotary_dim=8,
                      n_positions=128, n_ctx=128)


@register("stablelm", "decoder")
def stablelm():
    from transformers import StableLmConfig, StableLmForCausalLM

    return _causal_lm(StableLmForCausalLM, StableLmConfig, **LLAMA_LIKE)


@register("olmo", "decoder")
def olmo():
    from transformers import OlmoConfig, OlmoForCausalLM

    return _causal_lm(OlmoForCausalLM, OlmoConfig, **LLAMA_LIKE)


@register("olmo2", "decoder")
def olmo2():
    from transformers import Olmo2Config, Olmo2ForCausalLM

    return _causal_lm(Olmo2ForCausalLM, Olmo2Config, **LLAMA_LIKE)


@register("starcoder2", "decoder")
def starcoder2():
    from transformers import Starcoder2Config, Starcoder2ForCausalLM

    return _causal_lm(Starcoder2ForCausalLM, Starcoder2Config, **LLAMA_LIKE)


@register("granite", "decoder")
def granite():
    from transformers import GraniteConfig, GraniteForCausalLM

    return _causal_lm(GraniteForCausalLM, GraniteConfig, **LLAMA_LIKE)


@register("cohere", "decoder")
def cohere():
    from transformers import CohereConfig, CohereForCausalLM

    return _causal_lm(CohereForCausalLM, CohereConfig, **LLAMA_LIKE)


@register("persimmon", "decoder")
def persimmon():
    from transformers import PersimmonConfig, PersimmonForCausalLM

    return _causal_lm(PersimmonForCausalLM, PersimmonConfig, num_hidden_layers=2, hidden_size=64,
                      intermediate_size=128, num_attention_heads=4, max_position_embeddings=128)


@register("xglm", "decoder")
def xglm():
    from transformers import XGLMConfig, XGLMForCausalLM

    return _causal_lm(XGLMForCausalLM, XGLMConfig, num_layers=2, d_model=64, ffn_dim=128, attention_heads=4,
                      max_position_embeddings=128)


# -------------------------------------------------------------------- text encoders
BERT_LIKE = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                 max_position_embeddings=128)


@register("bert", "encoder")
def bert():
    from transformers import BertConfig, BertModel

    return _encoder(BertModel, BertConfig, **BERT_LIKE)


@register("roberta", "encoder")
def roberta():
    from transformers import RobertaConfig, RobertaModel

    return _encoder(RobertaModel, RobertaConfig, **BERT_LIKE)


@register("xlm_roberta", "encoder")
def xlm_roberta():
    from transformers import XLMRobertaConfig, XLMRobertaModel

    return _encoder(XLMRobertaModel, XLMRobertaConfig, **BERT_LIKE)


@register("distilbert", "encoder")
def distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    return _encoder(DistilBertModel, DistilBertConfig, n_layers=2, dim=64, hidden_dim=128, n_heads=4,
                    max_position_embeddings=128)


@register("albert", "encoder")
def albert():
    from transformers import AlbertConfig, AlbertModel

    return _encoder(AlbertModel, AlbertConfig, embedding_size=32, **BERT_LIKE)


@register("electra", "encoder")
def electra():
    from transformers import ElectraConfig, ElectraModel

    return _encoder(ElectraModel, ElectraConfig, embedding_size=32, **BERT_LIKE)


@register("deberta", "encoder")
def deberta():
    from transformers import DebertaConfig, DebertaModel

    return _encoder(DebertaModel, DebertaConfig, **BERT_LIKE)


@register("deberta_v2", "encoder")
def deberta_v2():
    from transformers import DebertaV2Config, DebertaV2Model

    return _encoder(DebertaV2Model, DebertaV2Config, **BERT_LIKE)


@register("mpnet", "encoder")
def mpnet():
    from transformers import MPNetConfig, MPNetModel

    return _encoder(MPNetModel, MPNetConfig, **BERT_LIKE)


@register("mobilebert", "encoder")
def mobilebert():
    from transformers import MobileBertConfig, MobileBertModel

    return _encoder(MobileBertModel, MobileBertConfig, num_hidden_layers=2, hidden_size=64, embedding_size=32,
                    intermediate_size=64, num_attention_heads=4, intra_bottleneck_size=32,
                    num_feedforward_networks=1, max_position_embeddings=128)


@register("convbert", "encoder")
def convbert():
    from transformers import ConvBertConfig, ConvBertModel

    return _encoder(ConvBertModel, ConvBertConfig, embedding_size=64, **BERT_LIKE)


@register("ernie", "encoder")
def ernie():
    from transformers import ErnieConfig, ErnieModel

    return _encoder(ErnieModel, ErnieConfig, **BERT_LIKE)


# -------------------------------------------------------------------- encoder-decoders
@register("t5", "encoder-decoder")
def t5():
    from transformers import T5Config, T5ForConditionalGeneration

    return _seq2seq(T5ForConditionalGeneration, T5Config, d_model=64, d_ff=128, d_kv=16, num_layers=2,
                    num_heads=4, decoder_start_token_id=0, relative_attention_num_buckets=8)


@register("bart", "encoder-decoder")
def bart():
    from transformers import BartConfig, BartForConditionalGeneration

    return _seq2seq(BartForConditionalGeneration, BartConfig, d_model=64, encoder_layers=2, decoder_layers=2,
                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                    decoder_ffn_dim=128, max_position_embeddings=128)


@register("mbart", "encoder-decoder")
def mbart():
    from transformers import MBartConfig, MBartForConditionalGeneration

    return _seq2seq(MBartForConditionalGeneration, MBartConfig, d_model=64, encoder_layers=2, decoder_layers=2,
                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                    decoder_ffn_dim=128, max_position_embeddings=128)


@register("pegasus", "encoder-decoder")
def pegasus():
    from transformers import PegasusConfig, PegasusForConditionalGeneration

    return _seq2seq(PegasusForConditionalGeneration, PegasusConfig, d_model=64, encoder_layers=2,
                    decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                    decoder_ffn_dim=128, max_position_embeddings=128)


@register("marian", "encoder-decoder")
def marian():
    from transformers import MarianConfig, MarianMTModel

    return _seq2seq(MarianMTModel, MarianConfig, d_model=64, encoder_layers=2, decoder_layers=2,
                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                    decoder_ffn_dim=128, max_position_embeddings=128, decoder_start_token_id=0)


# -------------------------------------------------------------------- vision transformers
VIT_LIKE = dict(image_size=IMAGE, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128, **EAGER)


@register("vit", "vision")
def vit():
    from transformers import ViTConfig, ViTModel

    return _vision(ViTModel, ViTConfig, **VIT_LIKE)


@register("deit", "vision")
def deit():
    from transformers import DeiTConfig, DeiTModel

    return _vision(DeiTModel, DeiTConfig, **VIT_LIKE)


@register("beit", "vision")
def beit():
    from transformers import BeitConfig, BeitModel

    return _vision(BeitModel, BeitConfig, use_relative_position_bias=True, **VIT_LIKE)


@register("dinov2", "vision")
def dinov2():
    from transformers import Dinov2Config, Dinov2Model

    return _vision(Dinov2Model, Dinov2Config, **VIT_LIKE)


@register("swin", "vision")
def swin():
    from transformers import SwinConfig, SwinModel

    return _vision(SwinModel, SwinConfig, image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1],
                   num_heads=[2, 4], window_size=4, **EAGER)


@register("clip_vision", "vision")
def clip_vision():
    from transformers import CLIPVisionConfig, CLIPVisionModel

    return _vision(CLIPVisionModel, CLIPVisionConfig, **VIT_LIKE)


@register("siglip_vision", "vision")
def siglip_vision():
    from transformers import SiglipVisionConfig, SiglipVisionModel

    return _vision(SiglipVisionModel, SiglipVisionConfig, **VIT_LIKE)


@register("segformer", "vision")
def segformer():
    from transformers import SegformerConfig, SegformerModel

    return _vision(SegformerModel, SegformerConfig, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                   hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
                   mlp_ratios=[2, 2])


@register("levit", "vision")
def levit():
    from transformers import LevitConfig, LevitModel

    return _vision(LevitModel, LevitConfig, image_size=IMAGE, hidden_sizes=[32, 64], num_attention_heads=[2, 4],
                   depths=[1, 1], key_dim=[8, 8], drop_path_rate=0, mlp_ratio=[2, 2], attention_ratio=[2, 2],
                   down_ops=[["Subsample", 8, 2, 4, 2, 2]])


@register("mobilevit", "vision")
def mobilevit():
    from transformers import MobileViTConfig, MobileViTModel

    return _vision(MobileViTModel, MobileViTConfig, image_size=IMAGE, hidden_sizes=[32, 48, 64],
                   neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_attention_heads=2)


@register("poolformer", "vision")
def poolformer():
    from transformers import PoolFormerConfig, PoolFormerModel

    return _vision(PoolFormerModel, PoolFormerConfig, depths=[1, 1], hidden_sizes=[16, 32], num_encoder_blocks=2,
                   patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1], mlp_ratio=2.0)


# -------------------------------------------------------------------- CNNs
@register("resnet", "cnn")
def resnet():
    from transformers import ResNetConfig, ResNetModel

    return _vision(ResNetModel, ResNetConfig, output="pooler_output", embedding_size=16, hidden_sizes=[16, 32],
                   depths=[1, 1], layer_type="basic")


@register("convnext", "cnn")
def convnext():
    from transformers import ConvNextConfig, ConvNextModel

    return _vision(ConvNextModel, ConvNextConfig, output="pooler_output", hidden_sizes=[16, 32], depths=[1, 1],
                   num_stages=2)


@register("convnextv2", "cnn")
def convnextv2():
    from transformers import ConvNextV2Config, ConvNextV2Model

    return _vision(ConvNextV2Model, ConvNextV2Config, output="pooler_output", hidden_sizes=[16, 32],
                   depths=[1, 1], num_stages=2)


@register("mobilenet_v1", "cnn")
def mobilenet_v1():
    from transformers import MobileNetV1Config, MobileNetV1Model

    return _vision(MobileNetV1Model, MobileNetV1Config, output="pooler_output", image_size=IMAGE,
                   depth_multiplier=0.25)


@register("mobilenet_v2", "cnn")
def mobilenet_v2():
    from transformers import MobileNetV2Config, MobileNetV2Model

    return _vision(MobileNetV2Model, MobileNetV2Config, output="pooler_output", image_size=IMAGE,
                   depth_multiplier=0.25)


@register("efficientnet", "cnn")
def efficientnet():
    from transformers import EfficientNetConfig, EfficientNetModel

    return _vision(EfficientNetModel, EfficientNetConfig, output="pooler_output", image_size=IMAGE,
                   width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320)


@register("regnet", "cnn")
def regnet():
    from transformers import RegNetConfig, RegNetModel

    return _vision(RegNetModel, RegNetConfig, output="pooler_output", embedding_size=16, hidden_sizes=[16, 32],
                   depths=[1, 1], groups_width=8)


# -------------------------------------------------------------------- audio encoders
WAV2VEC2_LIKE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     conv_dim=(16, 16, 16), conv_stride=(5, 4, 2), conv_kernel=(10, 8, 4),
                     num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)


@register("wav2vec2", "audio")
def wav2vec2():
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    return _audio(Wav2Vec2Model, Wav2Vec2Config, **WAV2VEC2_LIKE)


@register("hubert", "audio")
def hubert():
    from transformers import HubertConfig, HubertModel

    return _audio(HubertModel, HubertConfig, **WAV2VEC2_LIKE)


@register("wavlm", "audio")
def wavlm():
    from transformers import WavLMConfig, WavLMModel

    return _audio(WavLMModel, WavLMConfig, num_buckets=32, max_bucket_distance=64, **WAV2VEC2_LIKE)


@register("data2vec_audio", "audio")
def data2vec_audio():
    from transformers import Data2VecAudioConfig, Data2VecAudioModel

    return _audio(Data2VecAudioModel, Data2VecAudioConfig, **WAV2VEC2_LIKE)


@register("whisper_encoder", "audio")
def whisper_encoder():
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    config = WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                           decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
                           max_source_positions=32, max_target_positions=32, vocab_size=VOCAB, **EAGER)
    model = WhisperEncoder(config).eval()
    # the encoder takes log-mel features of exactly 2 * max_source_positions frames
    features = torch.randn(1, config.num_mel_bins, 2 * config.max_source_positions)
    return Positional(model, ("input_features",), "last_hidden_state"), (features,)
