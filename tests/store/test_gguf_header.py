"""The fast GGUF header reader: same answers as gguf's own reader, on files and on byte prefixes."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from kinfer.store.gguf_header import (
    ArraySummary,
    GGUFFormatError,
    NeedMoreBytes,
    parse_gguf_header,
    read_gguf_header,
)
from tests.fixtures.tiny_gguf import CHATML_TEMPLATE, tiny_gguf_parameter_count, write_tiny_gguf


def test_reads_the_metadata_a_conversion_writes(tmp_path: Path) -> None:
    [path] = write_tiny_gguf(tmp_path / "tiny.gguf", n_ctx=4096, quant="Q8_0")

    header = read_gguf_header(path)

    assert header.version == 3
    assert header.architecture == "llama"
    assert header.get("general.name") == "Tiny Test Model"
    assert header.context_length == 4096
    assert header.arch_value("block_count") == 2
    assert header.chat_template == CHATML_TEMPLATE
    assert header.file_type == "Q8_0"
    assert header.tensor_count == 21
    assert header.parameter_count == tiny_gguf_parameter_count()
    assert header.elements_by_type().most_common(1)[0][0] == "Q8_0"


def test_agrees_with_gguf_reader(tmp_path: Path) -> None:
    [path] = write_tiny_gguf(tmp_path / "tiny.gguf", quant="F16")
    reference = gguf.GGUFReader(path)

    header = read_gguf_header(path)

    for key, field in reference.fields.items():
        if key.startswith("GGUF."):
            continue  # the reader's own bookkeeping (version, counts)
        value = field.contents()
        if isinstance(value, float):
            assert header.metadata[key] == pytest.approx(value), key
        else:
            assert header.metadata[key] == value, key
    assert [(t.name, t.shape, t.type_name) for t in header.tensors] == [
        (t.name, tuple(int(n) for n in t.shape), t.tensor_type.name) for t in reference.tensors
    ]


def test_long_arrays_are_summarised_not_decoded(tmp_path: Path) -> None:
    [path] = write_tiny_gguf(tmp_path / "vocab.gguf", n_vocab=5000)

    header = read_gguf_header(path)

    assert header.get("tokenizer.ggml.tokens") == ArraySummary("string", 5000)
    assert header.get("tokenizer.ggml.token_type") == ArraySummary("int32", 5000)
    # short arrays are kept as lists
    assert header.get("tokenizer.ggml.merges") == [f"t {i}" for i in range(16)]
    # and everything after the long arrays is still read
    assert header.chat_template == CHATML_TEMPLATE


def test_real_smollm2_header(smollm2_gguf: Path) -> None:
    header = read_gguf_header(smollm2_gguf)

    assert header.architecture == "llama"
    assert header.context_length == 8192
    assert header.file_type == "Q4_1"
    assert header.tensor_count == 272
    assert header.parameter_count == 134_515_008
    assert header.get("tokenizer.ggml.tokens") == ArraySummary("string", 49152)
    assert "<|im_start|>" in header.chat_template


def test_a_prefix_reads_like_the_file(tmp_path: Path) -> None:
    [path] = write_tiny_gguf(tmp_path / "tiny.gguf", n_vocab=2000)
    data = path.read_bytes()

    # what the pull helper does: fetch a little, and more whenever the reader asks for it
    size, rounds = 64, 0
    while True:
        rounds += 1
        try:
            header = parse_gguf_header(data[:size], need_tensors=True)
            break
        except NeedMoreBytes as exc:
            assert exc.needed > size
            size = max(exc.needed, size * 2)

    assert rounds > 1
    assert header.metadata == read_gguf_header(path).metadata
    assert header.tensors == read_gguf_header(path).tensors


def test_a_prefix_ending_in_the_tensor_infos_still_gives_the_metadata(tmp_path: Path) -> None:
    [path] = write_tiny_gguf(tmp_path / "tiny.gguf")
    full = read_gguf_header(path)
    prefix = path.read_bytes()[: full.kv_end + 10]

    header = parse_gguf_header(prefix)

    assert header.metadata == full.metadata
    assert header.tensor_count == 21
    assert header.tensors is None
    assert header.parameter_count is None
    with pytest.raises(NeedMoreBytes):
        parse_gguf_header(prefix, need_tensors=True)


def test_a_prefix_ending_in_the_metadata_asks_for_more(tmp_path: Path) -> None:
    [path] = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = path.read_bytes()

    with pytest.raises(NeedMoreBytes) as caught:
        parse_gguf_header(data[:100])

    assert 100 < caught.value.needed <= len(data)


def test_big_endian_files(tmp_path: Path) -> None:
    path = tmp_path / "be.gguf"
    writer = gguf.GGUFWriter(path, "llama", endianess=gguf.GGUFEndian.BIG)
    writer.add_context_length(512)
    writer.add_string("general.name", "big endian")
    writer.add_tensor(
        "token_embd.weight", np.ones((4, 8), np.float32), tensor_endianess=gguf.GGUFEndian.LITTLE
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    header = read_gguf_header(path)

    assert header.context_length == 512
    assert header.get("general.name") == "big endian"
    assert header.tensors[0].shape == (8, 4)


def test_not_a_gguf(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"<html>404 not found</html>" * 4)

    with pytest.raises(GGUFFormatError, match="not a GGUF"):
        read_gguf_header(path)


def test_truncated_file(tmp_path: Path) -> None:
    [path] = write_tiny_gguf(tmp_path / "tiny.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:300])

    with pytest.raises(GGUFFormatError, match="truncated"):
        read_gguf_header(cut)


def test_version_1_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "v1.gguf"
    path.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(24))

    with pytest.raises(GGUFFormatError, match="version 1"):
        read_gguf_header(path)


def test_split_shards_carry_split_keys(tmp_path: Path) -> None:
    paths = write_tiny_gguf(tmp_path / "big.gguf", split=3)

    headers = [read_gguf_header(p) for p in paths]

    assert [p.name for p in paths] == [f"big-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert [(h.split_no, h.split_count) for h in headers] == [(0, 3), (1, 3), (2, 3)]
    assert headers[0].architecture == "llama"
    assert sum(h.parameter_count for h in headers) == tiny_gguf_parameter_count()
