"""seeds.py: writes the h5py half of the loader's fuzz seed corpus (small
valid kvtrace files, each exercising another reader path: contiguous,
chunked + gzip + shuffle, float32 without v or tokens, two layers,
fixed-length string attributes, bfloat16-free float64) into DIR.
usage: python tests/fuzz/seeds.py DIR"""
import sys

import h5py
import numpy as np


def write(path, T=16, P=12, Hq=2, Hkv=1, D=4, dtype='f2', chunks=None, comp=None, shuffle=False, v=True,
          tokens=True, layers=(0,), fixed_strings=False):
    rng = np.random.default_rng(len(path))
    with h5py.File(path, 'w') as f:
        f.attrs['kvtrace_version'] = 1
        for k, s in (('model', 'tiny'), ('description', 'fuzz seed'), ('rope', 'applied')):
            f.attrs[k] = np.bytes_(s) if fixed_strings else s
        f.attrs['head_dim'] = D
        f.attrs['num_q_heads'] = Hq
        f.attrs['num_kv_heads'] = Hkv
        f.attrs['num_tokens'] = T
        f.attrs['prefill_len'] = P
        f.attrs['softmax_scale'] = 1 / np.sqrt(D)
        if tokens:
            f.create_dataset('tokens', data=np.arange(T, dtype='i4'), chunks=chunks and (T,), compression=comp)
        lg = f.create_group('layers')
        for li in layers:
            g = lg.create_group('L%d' % li)
            g.attrs['layer_index'] = li
            for n, H in (('q', Hq), ('k', Hkv), ('v', Hkv)):
                if n != 'v' or v:
                    g.create_dataset(n, data=rng.standard_normal((H, T, D)).astype(dtype), chunks=chunks,
                                     compression=comp, shuffle=shuffle)


if __name__ == '__main__':
    out = sys.argv[1]
    write(out + '/plain.h5')
    write(out + '/chunk_gzip.h5', chunks=(1, 4, 4), comp='gzip', shuffle=True)
    write(out + '/f32_two_layers.h5', dtype='f4', layers=(0, 2), v=False, tokens=False)
    write(out + '/fixed_strings.h5', fixed_strings=True, T=8, P=4, Hq=1, D=2)
    write(out + '/f64_gqa.h5', dtype='f8', Hq=4, Hkv=2, T=6, P=3, D=2)
