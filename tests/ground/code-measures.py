#!/usr/bin/env python3
"""Code measures for the structure issues: per workspace member (read from the root Cargo.toml, so a new crate
is measured without editing this), the largest source file and the functions over 60 lines (brace-matched `fn`
bodies above each file's first `#[cfg(test)]`), the longest first.

  tests/ground/code-measures.py [REPO_ROOT]    # default: the repository this script is in
"""
import os, re, sys, subprocess
root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
def fns(path):
    text = open(path).read()
    lines = text.split('\n')
    out = []
    # stop at first #[cfg(test)]
    cut = next((i for i,l in enumerate(lines) if l.strip()=='#[cfg(test)]'), len(lines))
    i = 0
    pat = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)')
    while i < cut:
        m = pat.match(lines[i])
        if m:
            name = m.group(6)
            depth = 0; started=False; j=i
            while j < len(lines):
                for ch in lines[j]:
                    if ch=='{': depth+=1; started=True
                    elif ch=='}': depth-=1
                if started and depth==0: break
                if not started and lines[j].rstrip().endswith(';'): break
                j+=1
            if started: out.append((j-i+1, name, path, i+1))
            i = j+1 if started else i+1
        else: i+=1
    return out
def members():
    text = open(os.path.join(root, 'Cargo.toml')).read()
    block = re.search(r'^members\s*=\s*\[(.*?)\]', text, re.S | re.M)
    if not block: sys.exit('code-measures: no [workspace] members in Cargo.toml')
    return [m + '/src' for m in re.findall(r'"([^"]+)"', block.group(1))]
for crate in members():
    files=[]; allf=[]
    for d,_,fs in os.walk(os.path.join(root,crate)):
        for f in fs:
            if f.endswith('.rs'):
                p=os.path.join(d,f); n=sum(1 for _ in open(p)); files.append((n,p)); allf+=fns(p)
    files.sort(); allf.sort(reverse=True)
    longest = f'{allf[0][0]} {allf[0][1]}' if allf else 'none'
    print(crate, 'largest file', files[-1][0], files[-1][1].replace(root+'/',''), '| longest fn', longest)
    for f in [x for x in allf if x[0] > 60]: print('  fn', f[0], f[1], f[2].replace(root+'/',''), f[3])
