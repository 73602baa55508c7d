"""A real Coqui VITS with random weights, saved the way Coqui saves a trained model.

``build_vits(directory)`` writes ``model.pth`` (``{"model": state_dict}``) and ``config.json``; the
engine then loads them through Coqui's own ``Synthesizer``, the path a downloaded model takes. The
text front end is plain characters (``use_phonemes=False``), so no phonemizer or espeak is needed.
``size="tiny"`` is a reduced model for fast tests; ``size="ljspeech"`` keeps the architecture of
Coqui's LJSpeech VITS (the default ``VitsArgs``), for benchmarks where only speed matters.
"""

from __future__ import annotations

from pathlib import Path

TINY_ARGS = {
    "hidden_channels": 32,
    "hidden_channels_ffn_text_encoder": 64,
    "num_heads_text_encoder": 2,
    "num_layers_text_encoder": 2,
    "num_layers_posterior_encoder": 2,
    "num_layers_flow": 2,
    "upsample_initial_channel_decoder": 32,
    "upsample_rates_decoder": [8, 8, 4],
    "upsample_kernel_sizes_decoder": [16, 16, 8],
    "resblock_kernel_sizes_decoder": [3],
    "resblock_dilation_sizes_decoder": [[1, 3, 5]],
    "dropout_p_duration_predictor": 0.0,
    "spec_segment_size": 8,
}


def build_vits(directory: Path, *, size: str = "tiny", seed: int = 0) -> tuple[Path, Path]:
    """Write a random-weight Coqui VITS into ``directory``; return ``(checkpoint, config)``."""
    import torch
    from TTS.tts.configs.shared_configs import CharactersConfig
    from TTS.tts.configs.vits_config import VitsConfig
    from TTS.tts.models.vits import Vits, VitsArgs

    args = VitsArgs(init_discriminator=False, **(TINY_ARGS if size == "tiny" else {}))
    characters = CharactersConfig(
        characters_class="TTS.tts.models.vits.VitsCharacters",
        pad="_",
        eos="",
        bos="",
        blank=None,
        characters="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        punctuations="!'(),-.:;? ",
        phonemes="",
        is_unique=True,
        is_sorted=True,
    )
    config = VitsConfig(
        model_args=args,
        use_phonemes=False,
        characters=characters,
        text_cleaner="basic_cleaners",
        add_blank=True,
    )
    torch.manual_seed(seed)
    model = Vits(config)
    directory.mkdir(parents=True, exist_ok=True)
    checkpoint, config_path = directory / "model.pth", directory / "config.json"
    torch.save({"model": model.state_dict()}, checkpoint)
    config.save_json(str(config_path))
    return checkpoint, config_path
