"""The speculative step loop over a running batch of sequences of different lengths, with continuous
batching: sequences are admitted (prefilled) and retired at step boundaries. A step drafts a tree per
sequence -> one target verify forward for the whole batch -> accepts a path per sequence -> compacts each
sequence's KV cache -> extends the draft over what was accepted.

Running sequence i lives in row i of the KV caches; a sequence that finishes or is released leaves, and the
rows after it move up, so the running batch is always rows 0..B-1 (the model reads rows :B). With a prefix
cache, rows past max_batch keep leaving sequences' KV, and an admitted prompt that starts alike copies it in and
prefills only the rest (prefix_cache.py, prefill_plan.py).
Without a draft head every round verifies the root alone, which is plain decoding with the same code.
The forwards themselves (graphs, the compiled CPU step, eager) and the KV caches are the runner's (runner.py).
Sequences are right-padded where lengths differ: a pad writes to cache slots past its sequence's end, which
no mask lets anyone read and which the next round overwrites.
"""
from __future__ import annotations

import time

import torch

from toolkit.infer.draft_sampling import gumbel_inputs
from toolkit.infer.drafts import Eagle3Head
from toolkit.infer.kv_cache import cache_length
from toolkit.infer.logprobs import prompt_logprobs, token_logprobs
from toolkit.infer.lookup import LookupConfig, graft_all, propose
from toolkit.infer.model import Transformer
from toolkit.infer.penalties import Penalties
from toolkit.infer.phase_clock import PhaseClock
from toolkit.infer.prefill_plan import admission_groups, pad, prefill_groups
from toolkit.infer.prefix_cache import PrefixCache
from toolkit.infer.runner import Runner
from toolkit.infer.sampling import SamplingParams, target_probs
from toolkit.infer.sequence import Result, Sequence, StopStrings, check_request
from toolkit.infer.tree import Tree, TreeConfig, ancestor_masks, window_mask
from toolkit.infer.verify import stop_at_empty, verify_tree


class Engine:
    def __init__(self, target: Transformer, head: Eagle3Head | None = None, tree: TreeConfig | None = None,
                 max_len: int | None = 2048, max_batch: int = 1, memory_fraction: float = 0.3,
                 cuda_graphs: bool | None = None, graph_capture=None, compile: bool = False,
                 sample_draft: bool = False, lookup: LookupConfig | None = None, prefix_cache_rows: int = 0,
                 draft_graphs: bool = True):
        """max_len None: size the KV cache from free memory (memory_fraction of it), capped by the
        target's max_position_embeddings. cuda_graphs, graph_capture, compile, draft_graphs: how the forwards run
        (Runner).
        sample_draft: a chain draws its draft tokens from the head's tempered distribution for sequences that
        sample, verified with speculative sampling (verify.sample_chain_verify), instead of proposing the
        head's top-1; greedy sequences are drafted and verified as before.
        lookup: each round also proposes the prompt-lookup continuation of each sequence (lookup.py), merged
        into the head's tree as one more branch (or, without a head, as the only draft).
        prefix_cache_rows: spare cache rows that keep finished sequences' KV for later prompts that start alike
        (prefix_cache.py); 0: none."""
        self.target, self.head = target, head
        self.tree = tree or TreeConfig(num_steps=1, topk=1, num_draft_tokens=2)
        if head is not None and self.tree.topk > len(head.d2t):
            raise ValueError(f"--topk {self.tree.topk} exceeds the draft vocabulary ({len(head.d2t)})")
        if sample_draft and (head is None or self.tree.topk != 1):
            raise ValueError(f"--sample-draft needs a draft head and a chain (--topk 1), got "
                             f"{'no draft' if head is None else f'--topk {self.tree.topk}'}: a tree's top-k "
                             "candidates are verified against the target alone")
        if sample_draft and lookup is not None:
            raise ValueError("--sample-draft and --lookup do not mix: a sampled chain's draft law does not cover "
                             "the lookup branch")
        self.sample_draft, self.lookup = sample_draft, lookup
        extra = lookup.num_tokens if lookup is not None else 0  # the lookup branch's nodes, at most
        dtype, self.device = target.embed_tokens.weight.dtype, target.embed_tokens.weight.device
        # the target id of each draft id: where a sampled chain's draft law sits in the target's vocabulary
        self._draft_ids = None if not sample_draft else head.to_target(
            torch.arange(len(head.d2t), device=head.d2t.device))
        max_len = cache_length(target.config, max_len, max_batch, prefix_cache_rows, memory_fraction, dtype,
                               self.device)
        self.max_len, self.max_batch = max_len, max_batch
        self.runner = Runner(target, head, self.tree, extra, max_len, max_batch, cuda_graphs, graph_capture, compile,
                             sample_draft, prefix_cache_rows, draft_graphs)
        self.prefix_cache = PrefixCache(max_batch, prefix_cache_rows) if prefix_cache_rows else None
        self.cache, self.draft_cache = self.runner.cache, self.runner.draft_cache  # row i: running sequence i
        self.aux_layers, self._host = self.runner.aux_layers, self.runner.host
        self.running: list[Sequence] = []  # running sequence i is in cache row i
        self.seconds = {"prefill": 0.0, "draft": 0.0, "verify": 0.0}  # engine time so far, by phase
        self.clock = PhaseClock(self.device)  # draft / verify split without syncing the device

    def warm_up(self) -> None:
        """Compile (compile=True) every step shape this engine's rounds take, so that no compile lands inside a
        timed run or a served request. A no-op otherwise; needs an idle engine."""
        if self.runner.compiled is not None and self.running:
            raise RuntimeError("warm_up needs an idle engine; it is serving other sequences")
        self.runner.warm_up()

    def check(self, prompt: list[int], params: SamplingParams) -> None:
        """Refuse what cannot fit this engine (sequence.check_request)."""
        check_request(prompt, params, self.target.config.vocab_size, self.max_len)

    def generate(self, prompt: list[int], params: SamplingParams, stop_ids=frozenset(), generator=None,
                 stop_strings: StopStrings | None = None) -> Result:
        return self.generate_batch([prompt], params, stop_ids, generator, stop_strings)[0]

    def generate_batch(self, prompts: list[list[int]], params: SamplingParams, stop_ids=frozenset(),
                       generator: torch.Generator | None = None, stop_strings: StopStrings | None = None
                       ) -> list[Result]:
        if self.running:
            raise RuntimeError("generate_batch needs an idle engine; it is serving other sequences")
        seqs = [Sequence(p, params, frozenset(stop_ids), stop_strings, generator) for p in prompts]
        try:
            self.admit(seqs)
            while self.running:
                self.step()
        except BaseException:  # Ctrl-C or an error mid-run: left running, they would refuse every later call
            self.running = []  # the engine was idle, so all of them are this call's; their rows are free again
            raise
        return [s.result for s in seqs]

    @torch.no_grad()
    def admit(self, seqs: list[Sequence]) -> None:
        """Prefill `seqs` into the rows after the running ones and pick each one's first token; sequences
        that stop at it are done at once and never join the running batch."""
        n, m = len(self.running), len(seqs)
        if not 1 <= m <= self.max_batch - n:
            raise ValueError(f"{m} sequences to admit; this engine has {self.max_batch - n} free of "
                             f"{self.max_batch} rows")
        for s in seqs:
            self.check(s.prompt, s.params)
        t0 = time.perf_counter()
        # per sequence: the row its prompt's prefix comes from (a kept one or an earlier prompt's) and its length
        plans = [(None, 0)] * m if self.prefix_cache is None else self.prefix_cache.plan(
            [s.prompt for s in seqs], range(n, n + m), [s.params.prompt_logprobs is None for s in seqs])
        for s, (_, reuse) in zip(seqs, plans):
            s.result.cached_tokens = reuse
        for g, start in admission_groups([p[1] for p in plans], [len(s.prompt) for s in seqs], prefill_groups):
            part, row0 = seqs[g.start:g.stop], n + g.start
            if start:  # a hit, alone in its group: its source row is filled by now (earlier groups went first)
                self.runner.move(plans[g.start][0], row0, start)
            ids = self._host(pad([s.prompt[start:] for s in part], 0))
            last = self._host([len(s.prompt) - 1 - start for s in part])
            scored = any(s.params.prompt_logprobs is not None for s in part)  # then the final hidden states too
            logits, aux = self.runner.prefill(ids, row0, last, [*self.aux_layers, -1] if scored else self.aux_layers,
                                              start)
            normed, aux = (aux[-1], aux[:-1]) if scored else (None, aux)                    # [b, T, H]
            for b, s in enumerate(part):
                s.prefix = s.drafted = len(s.prompt)
                if s.params.prompt_logprobs is not None:
                    s.result.prompt_logprobs = prompt_logprobs(self.target.readout, normed[b], s.prompt,
                                                               s.params.prompt_logprobs)
                if s.params.penalized:  # counts from here on: the prompt's ids, then each token added
                    held = s.stop_ids if s.held_ids is None else s.held_ids
                    s.penalties = Penalties(s.params, s.prompt, logits.shape[-1], self.device, held)
                scores = logits[b] if s.grammar is None else s.grammar.apply(logits[b])            # [1, V]
                scores = scores if s.penalties is None else s.penalties.apply(scores)
                if (s.grammar is not None or s.penalties is not None) and bool(torch.isneginf(scores[0]).all()):
                    s.stuck()  # its constraints allow no first token
                    continue
                token = self._pick(scores[0], s.params, s.generator)
                if s.params.logprobs is not None:
                    s.result.logprobs += token_logprobs(logits[b], [token], s.params.logprobs)
                s.add(token)
            if self.head is not None:  # draft pairs (token t+1, target hidden t) for t = start..len-1
                nxt = self._host(pad([(s.prompt[1:] + (s.result.tokens or [0]))[start:] for s in part], 0))  # 0: stuck
                self.runner.extend(part, nxt, torch.cat(aux, -1), [start] * len(part), row0)
        self.seconds["prefill"] += time.perf_counter() - t0
        for s in seqs:
            s.result.seconds["prefill"] += (time.perf_counter() - t0) / m
        self.running += seqs
        self._retire()

    @torch.no_grad()
    def step(self, speculate: bool = True) -> list[Sequence]:
        """One speculative round for every running sequence; returns them (finished ones are done and have
        left the running batch). speculate=False verifies the roots alone (plain decoding) but still extends
        the draft over the new tokens, so speculation can resume at the next step."""
        seqs, t1 = list(self.running), self.clock.mark()
        if not seqs:
            return []
        prefix, roots = [s.prefix for s in seqs], [s.result.tokens[-1] for s in seqs]
        if self.head is not None and speculate:
            root_out, root_logp = torch.stack([s.root_out for s in seqs]), torch.stack([s.root_logp for s in seqs])
            sampled = {} if not self.sample_draft else gumbel_inputs(
                [s.params for s in seqs], [s.generator for s in seqs], self.tree.num_steps, len(self.head.d2t),
                self.device)
            trees = self.runner.grow(prefix, roots, root_out, root_logp, sampled)
        else:
            trees = [Tree(torch.tensor([root]), torch.tensor([-1]), torch.tensor([0])) for root in roots]
        own = len(trees[0].tokens)  # nodes the head drafted; a lookup branch's new nodes come after them
        if self.lookup is not None and speculate:
            chains = [propose(s.prompt + s.result.tokens, self.lookup) for s in seqs]
            if any(chains):  # else the round verifies the head's tree alone; rows pad to the largest merge
                trees = graft_all(trees, chains)
        t2 = self.clock.mark()
        grafted = len(trees[0].tokens) > own
        paths, emitted, aux, logprobs, stuck = self._verify(trees, seqs, grafted=grafted)
        t3 = self.clock.mark()
        # draft tokens each sequence's step checked: the head's own nodes, or (a branch grafted) the real nodes of
        # its merged tree, padding left out (read after the verify, which has synced: no extra wait)
        checked = [int((t.parents[1:] >= 0).sum()) for t in trees] if grafted else [own - 1] * len(seqs)
        for s, path, out, lp, n, dead in zip(seqs, paths, emitted, logprobs, checked, stuck):
            s.result.verify_steps += 1
            s.result.checked.append(n)
            added = next((i + 1 for i, tok in enumerate(out) if s.add(tok)), len(out))  # stop where plain would
            if dead and not s.done:
                s.stuck()
            s.result.logprobs += lp[:added]
            s.result.accepted.append(max(added - 1, 0))  # tokens this step emitted, the bonus not counted
            s.result.from_lookup += sum(node >= own for node in path[1:added])  # of those, nodes only lookup had
        for s, path in zip(seqs, paths):
            s.prefix += len(path)
        if self.head is not None and not all(s.done for s in seqs):
            fused = torch.cat(aux, -1)                                             # [B, n, F]
            width = max(len(p) for p in paths)  # each path's nodes, its last repeated as padding
            idx = self._host([p + p[-1:] * (width - len(p)) for p in paths])       # [B, width]
            hidden = fused.gather(1, idx[:, :, None].expand(-1, -1, fused.shape[-1]))
            self.runner.extend(seqs, self._host(pad(emitted, 0)), hidden, prefix, 0)
            for s in seqs:
                s.drafted = s.prefix
        self._retire()
        t4 = self.clock.mark()
        between = self.clock.between
        draft, verify = between(t1, t2) + between(t3, t4), between(t2, t3)
        self.seconds["draft"] += draft
        self.seconds["verify"] += verify
        for s in seqs:
            s.result.seconds["draft"] += draft / len(seqs)
            s.result.seconds["verify"] += verify / len(seqs)
        return seqs

    def release(self, seq: Sequence) -> None:
        """Take a running sequence out between steps (a cancelled request); its row is reused."""
        seq.done = True
        self._retire()

    def _retire(self) -> None:
        """Drop finished sequences from the running batch (their KV kept in the prefix cache, when there is one);
        later rows move up to keep rows 0..B-1 packed."""
        for row, s in enumerate(self.running):
            if s.done and self.prefix_cache is not None:
                self.prefix_cache.keep(s, lambda dst, n, row=row: self.runner.move(row, dst, n), self.head is not None)
        keep = [(row, s) for row, s in enumerate(self.running) if not s.done]
        for new, (old, s) in enumerate(keep):
            if new != old:
                self.runner.move(old, new, s.prefix)
        self.running = [s for _, s in keep]

    def _pick(self, logits, params, generator) -> int:
        if params.greedy:
            return int(logits.argmax())
        return int(torch.multinomial(target_probs(logits, params), 1, generator=generator))

    def _verify(self, trees: list[Tree], seqs: list[Sequence], grafted: bool = False):
        """One target forward over every sequence's tree; returns per sequence the accepted path and the
        emitted tokens, the aux hidden states of the tree nodes, the emitted tokens' log-probs where the
        sequence asks for them (emitted token i was chosen at path node i), and whether its constraints left no
        token after the last one. Accepted nodes' KV moves to
        contiguous slots right after the sequence's prefix. grafted: the trees carry a lookup branch."""
        n, dev, prefix = len(trees[0].tokens), self.device, [s.prefix for s in seqs]
        start = self._host(prefix)[:, None]                                            # [B, 1]
        slots = start + torch.arange(n, device=dev)                                    # [B, n]
        ancestors = None  # [B, n, n] for a tree, which penalized sequences reuse
        if n == 1 or (self.tree.topk == 1 and not grafted):  # plain decoding or a chain: node t sees every slot
            mask = torch.arange(max(prefix) + n, device=dev) <= slots[:, :, None]       # up to its own [B, n, S]
        else:
            deepest = self.tree.num_steps + (self.lookup.num_tokens if grafted else 0)
            ancestors = ancestor_masks(self._host(torch.stack([t.parents for t in trees])), deepest)  # [B, n, n]
            mask = window_mask(start[:, 0], ancestors, max(prefix) + n)                # [B, n, S]
        tokens = self._host(torch.stack([t.tokens for t in trees]))
        positions = start + self._host(torch.stack([t.depth for t in trees]))
        logits, aux = self.runner.verify(tokens, positions, slots, mask)
        paths, emitted, logprobs, stuck = [], [], [], []
        for b, (tree, s) in enumerate(zip(trees, seqs)):
            scores = logits[b] if s.grammar is None else s.grammar.apply(logits[b], tree.tokens, tree.parents)
            scores = scores if s.penalties is None else s.penalties.apply(
                scores, tree.tokens, tree.ancestor_mask() if ancestors is None else ancestors[b])
            empty = None if s.grammar is None and s.penalties is None else torch.isneginf(scores).all(-1)  # [n]
            if empty is not None:  # rows the constraints leave no token: finite for the walk, which stops there
                scores = scores.masked_fill(empty[:, None], 0.0)
            path, out = verify_tree(tree, scores, s.params, s.generator, self._draft_ids)
            path, out, dead = (path, out, False) if empty is None else stop_at_empty(path, out, empty.tolist())
            self.cache.keep_path(b, s.prefix, path)
            paths.append(path)
            emitted.append(out)
            stuck.append(dead)
            logprobs.append([] if s.params.logprobs is None or not out else token_logprobs(
                logits[b, path[:len(out)]], out, s.params.logprobs))
        return paths, emitted, aux, logprobs, stuck
