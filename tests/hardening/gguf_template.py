"""Copy a GGUF with a different chat template: the real SmolLM2 weights under a hostile template."""

from __future__ import annotations

from pathlib import Path

import gguf


def copy_with_template(source: Path, target: Path, template: str) -> Path:
    """Write `target`: `source`'s metadata and tensors, with `tokenizer.chat_template` = `template`."""
    reader = gguf.GGUFReader(source)
    arch_field = reader.fields[gguf.Keys.General.ARCHITECTURE]
    writer = gguf.GGUFWriter(target, arch=arch_field.contents(), endianess=reader.endianess)
    for field in reader.fields.values():
        # the writer adds the architecture and GGUF.* itself; the template is the one thing replaced
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name.startswith(gguf.Keys.Tokenizer.CHAT_TEMPLATE):
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub_type)
    writer.add_chat_template(template)
    for tensor in reader.tensors:
        writer.add_tensor_info(
            tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()
    return target
