# Summarise an ncu source page (--page source --csv --print-source sass): stall reasons over the
# kernel and the instructions with most samples.  python3 bench/gpu/ncu_stalls.py FILE.csv [N]
import csv,sys,collections
f=sys.argv[1]
rows=list(csv.reader(open(f)))
hdr=rows[1]; data=rows[2:]
ix={h:i for i,h in enumerate(hdr)}
st=[h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
tot=collections.Counter(); n=0
for r in data:
    if len(r)<len(hdr): continue
    for h in st:
        try: tot[h]+=int(r[ix[h]])
        except: pass
s=sum(tot.values()); print("total samples",s)
for h,v in tot.most_common(10): print(f"{h:28s} {v:9d} {100*v/s:5.1f}%")
# top instructions by samples
top=sorted([r for r in data if len(r)>=len(hdr)], key=lambda r:-int(r[ix['Warp Stall Sampling (All Samples)']] or 0))[:int(sys.argv[2]) if len(sys.argv)>2 else 25]
for r in top:
    ss=sorted(((int(r[ix[h]] or 0),h) for h in st),reverse=True)[:3]
    print(r[ix['Warp Stall Sampling (All Samples)']].rjust(7), r[0][-5:], r[1].strip()[:60].ljust(60), ss)
