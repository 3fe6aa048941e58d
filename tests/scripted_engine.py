"""A scripted engine: the real Engine protocol with output chosen by the test.

Used only to unit-test the scheduler and to force exact model output (tool calls) through the
otherwise real pipeline. A token is one character; each step emits one per busy row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kinfer.engines.base import EngineStats, GenerationJob, JobUpdate, ModelInfo
from kinfer.engines.stop_strings import StopStringMatcher
from kinfer.errors import InvalidRequest

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass
class _Row:
    job: GenerationJob
    script: str
    choice: int = 0
    emitted: int = 0
    prefilled: bool = False
    stops: StopStringMatcher = field(default=None)  # type: ignore[assignment]


class ScriptedEngine:
    """`reply(prompt_text) -> str` decides what each request "generates"; a list of strings gives
    each of a job's choices (OpenAI's n) its own reply, by index.

    `fail_on`: a step raises (an engine fault) while a row whose reply holds this text decodes.
    `refuse_on`: `submit` refuses a prompt holding this text with `InvalidRequest`, as a real engine
    refuses a job it cannot run. `tokenize_fails_on`: `tokenize` raises a plain error (not a kinfer one)
    on text holding this, as a tokenizer can. `slow_tokenize`: (text, seconds) tokenizing text that
    holds `text` takes that long. `tokenize_threads` records the thread of every `tokenize` call.
    """

    def __init__(
        self,
        reply: Callable[[str], str],
        *,
        rows: int = 4,
        ctx: int = 4096,
        template: str | None = CHATML,
        fail_on: str | None = None,
        refuse_on: str | None = None,
        tokenize_fails_on: str | None = None,
        slow_tokenize: tuple[str, float] | None = None,
        name: str = "scripted",
        step_delay: float = 0.002,
    ) -> None:
        self.info = ModelInfo(
            name=name,
            engine="scripted",  # type: ignore[arg-type]  # a test engine, outside EngineName
            architecture="scripted",
            chat_template=template,
            bos_token="",
            eos_token="<|im_end|>",
            context_length=ctx,
            rows=rows,
        )
        self._reply = reply
        self._rows: dict[tuple[str, int], _Row] = {}
        self._cancelled: list[tuple[str, int]] = []
        self._fail_on = fail_on
        self._refuse_on = refuse_on
        self._tokenize_fails_on = tokenize_fails_on
        self._slow_tokenize = slow_tokenize
        self.tokenize_threads: set[str] = set()
        self._step_delay = step_delay  # a real forward pass takes time; so does this one
        self.steps = 0
        self.closed = False
        self.max_busy = 0

    def tokenize(self, text: str) -> list[int]:
        self.tokenize_threads.add(threading.current_thread().name)
        if self._tokenize_fails_on is not None and self._tokenize_fails_on in text:
            raise UnicodeEncodeError("scripted", text, 0, 1, "the scripted tokenizer cannot take this")
        if self._slow_tokenize is not None and self._slow_tokenize[0] in text:
            time.sleep(self._slow_tokenize[1])
        return [ord(c) for c in text]

    def detokenize(self, tokens: list[int]) -> str:
        return "".join(chr(t) for t in tokens)

    @property
    def free_rows(self) -> int:
        return self.info.rows - len(self._rows)

    @property
    def has_work(self) -> bool:
        return bool(self._rows or self._cancelled)

    def submit(self, job: GenerationJob) -> int:
        if self.free_rows < job.choices:
            raise RuntimeError("no free row")
        prompt = self.detokenize(list(job.prompt))
        if self._refuse_on is not None and self._refuse_on in prompt:
            raise InvalidRequest("the scripted engine refuses this prompt")
        scripts = self._reply(prompt)
        for choice in range(job.choices):
            script = scripts if isinstance(scripts, str) else scripts[choice]
            self._rows[job.job_id, choice] = _Row(job, script, choice, stops=StopStringMatcher(job.stop))
        self.max_busy = max(self.max_busy, len(self._rows))
        return 0  # no prefix pool

    def cancel(self, job_id: str) -> None:
        for key in [key for key in self._rows if key[0] == job_id]:
            del self._rows[key]
            self._cancelled.append(key)

    def step(self) -> list[JobUpdate]:
        self.steps += 1
        if self._step_delay:
            time.sleep(self._step_delay)
        updates = [JobUpdate(job_id, finish="cancelled", choice=c) for job_id, c in self._cancelled]
        self._cancelled.clear()
        for (job_id, choice), row in list(self._rows.items()):
            if not row.prefilled:
                row.prefilled = True
                updates.append(JobUpdate(job_id, prompt_processed=len(row.job.prompt), choice=choice))
                continue
            if self._fail_on is not None and self._fail_on in row.script:
                raise RuntimeError("scripted engine fault")
            piece = row.script[row.emitted] if row.emitted < len(row.script) else ""
            row.emitted += 1
            scan = row.stops.feed(piece)
            finish = None
            if scan.stopped or row.emitted > len(row.script):
                finish = "stop"
            elif row.emitted >= row.job.max_tokens:
                finish = "length"
            text = scan.text + (row.stops.flush() if finish == "length" else "")
            updates.append(
                JobUpdate(
                    job_id,
                    text=text,
                    new_tokens=1 if piece else 0,
                    finish=finish,
                    stop_string=scan.matched,
                    choice=choice,
                )
            )
            if finish:
                del self._rows[job_id, choice]
        return updates

    def stats(self) -> EngineStats:
        return EngineStats(rows_total=self.info.rows, rows_busy=len(self._rows), steps_total=self.steps)

    def close(self) -> None:
        self.closed = True
